"""`quire doctor`'s verdicts — pure: each check turns facts already gathered (by
tools/doctor_probe.py) into findings, each with the command that mends it. No sockets,
files, clocks or processes here, so every verdict is tested with plain values.

A finding's `name` is stable (scripts and tests match it); the three stalls of issue
#51 have their own:

* `job-window-waiting` (case 1): a job's next window is due and has waited past the
  grace, with the scheduler's reason (workers/jobs_wait.py);
* `store-accepted-by-no-worker` (case 2): a journal whose store no live worker writes
  to — its fragments stay on the coordinators' disks — and `persist-refused` for
  persist tasks refused with StoreNotAllowed;
* `leftover-local-cluster` (case 3): members of a local cluster still running after the
  `quire up` that started them died.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CoordinatorFacts", "Finding", "JobFacts", "JournalFacts", "Level", "LocalFacts", "Proc",
    "backlog_findings", "cert_findings", "clock_findings", "coordinator_findings",
    "exit_ok", "job_findings", "ktls_finding", "leftover_findings", "queue_findings",
    "route_findings",
    "service_finding", "store_findings", "worker_findings",
]

QUEUES = {
    "persist": "closed fragments are never stored",
    "index": "fragment indexes and watermarks are never refreshed",
    "pulse": "no pulse marks: job windows never complete, idle fragments never flush",
}
"""Queues every cluster needs a consumer of, and what stops without one."""


class Level(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    name: str
    level: Level
    subject: str
    message: str
    mend: str = ""

    def to_obj(self) -> dict[str, str]:
        return {"name": self.name, "level": self.level.value, "subject": self.subject,
                "message": self.message, "mend": self.mend}


def exit_ok(findings: Iterable[Finding]) -> bool:
    """Whether nothing is wrong (warnings are not)."""
    return all(f.level is not Level.FAIL for f in findings)


def _hms(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


# -- services ------------------------------------------------------------------------------

def service_finding(name: str, subject: str, error: str | None, ok: str, mend: str) -> Finding:
    """One service answered (`ok` says how) or did not (`error`)."""
    if error:
        return Finding(name, Level.FAIL, subject, error, mend)
    return Finding(name, Level.OK, subject, ok)


@dataclass(frozen=True)
class CoordinatorFacts:
    member: str
    endpoint: str
    health: str = ""
    exiting: bool = False
    error: str | None = None
    """Why Hello failed (None: it answered)."""


def coordinator_findings(members: Sequence[CoordinatorFacts]) -> list[Finding]:
    if not members:
        return [Finding("coordinators", Level.FAIL, "coordinators",
                        "no coordinator is registered in etcd: nothing accepts appends",
                        "quire coordinator --etcd $QUIRE_ETCD_URL   (or quire up)")]
    out = []
    for m in members:
        subject = f"coordinator {m.member} at {m.endpoint or '?'}"
        if m.error:
            out.append(Finding("coordinator", Level.FAIL, subject,
                               f"registered but does not answer Hello: {m.error}",
                               f"check its process and log; a dead one's key expires with "
                               f"its lease"))
        elif m.health:
            out.append(Finding("coordinator", Level.FAIL, subject, f"refuses writes: {m.health}",
                               "free or fix its spool directory (docs/operations.md), "
                               "then restart it"))
        elif m.exiting:
            out.append(Finding("coordinator", Level.WARN, subject,
                               "is exiting: its journals are moving away", ""))
        else:
            out.append(Finding("coordinator", Level.OK, subject, "answers Hello"))
    return out


def worker_findings(workers: Sequence[Any]) -> list[Finding]:
    """`workers`: topology.worker_stores.WorkerStores of every live worker."""
    if not workers:
        return [Finding("workers", Level.FAIL, "persist workers",
                        "no live worker has announced itself: fragments are never persisted, "
                        "indexed or pulsed (they stay on the coordinators' disks)",
                        "celery -A workers.app worker -Q celery,persist,index,pulse,prune,jobs "
                        "and celery -A workers.app beat   (or quire up)")]
    out = []
    for w in workers:
        stores = "any store" if not w.restricted else (", ".join(w.stores) or "no store")
        out.append(Finding("worker", Level.OK, f"worker {w.worker}",
                           f"alive (pid {w.pid}); writes to {stores}"))
    return out


def queue_findings(queues: Mapping[str, Sequence[str]] | str, announced: Sequence[Any], *,
                   jobs: bool) -> list[Finding]:
    """`queues`: Celery node -> the queues it consumes (its answer to `active_queues`),
    or why asking failed. `announced`: the WorkerStores in etcd. `jobs`: a job exists."""
    if isinstance(queues, str):
        return [Finding("skipped", Level.WARN, "worker queues",
                        f"not checked: the workers did not answer over Redis: {queues}", "")]
    out = []
    needed = dict(QUEUES)
    if jobs:
        needed["jobs"] = "job runs are never created or executed"
    consumed = {q for qs in queues.values() for q in qs}
    for queue, stops in needed.items():
        if queue not in consumed:
            out.append(Finding("queue-without-worker", Level.FAIL, f"queue {queue}",
                               f"no live worker consumes it: {stops}",
                               f"celery -A workers.app worker -Q {queue} (or add {queue} to a "
                               f"worker's -Q)"))
    names = set(queues)
    for w in announced:
        if w.worker not in names:
            out.append(Finding("worker-not-answering", Level.FAIL, f"worker {w.worker}",
                               "announced in etcd (its process lives) but does not answer "
                               "Celery's control channel: its pool may be wedged",
                               f"see its log; restart it (pid {w.pid})"))
    if not out:
        out.append(Finding("worker-queues", Level.OK, "worker queues",
                           f"{', '.join(sorted(needed))} each consumed by a live worker"))
    return out


# -- journals ------------------------------------------------------------------------------

@dataclass(frozen=True)
class JournalFacts:
    name: str
    desired: int
    assigned: int
    route: int | None
    """Members in the route its primary advertised (None: none advertised yet)."""
    stores: tuple[str, ...] = ()


def route_findings(journals: Sequence[JournalFacts], coordinators: int) -> list[Finding]:
    out = []
    for j in journals:
        if j.desired == 0:
            continue  # fully suspended: no route wanted
        if j.assigned < j.desired:
            mend = (f"start {j.desired - coordinators} more coordinator(s) (quire up "
                    f"--coordinators {j.desired}), or lower its replication"
                    if coordinators < j.desired else
                    "raise a coordinator's --journal-limit, or start another coordinator")
            out.append(Finding("journal-route-incomplete", Level.FAIL, f"journal {j.name}",
                               f"{j.assigned} of {j.desired} replicas assigned "
                               f"({coordinators} coordinator(s) registered)", mend))
        elif j.route is None or j.route < j.desired:
            out.append(Finding("journal-route-not-advertised", Level.WARN, f"journal {j.name}",
                               f"assigned {j.assigned} replicas but its primary has not "
                               f"advertised a full route yet (appends wait for it)",
                               f"wait a pulse interval (a pulse synchronizes it); if it "
                               f"persists, see its primary's log"))
    if journals and not out:
        out.append(Finding("journal-routes", Level.OK, "journals",
                           f"{len(journals)} journal(s), every one with a full route"))
    return out


def store_findings(journals: Sequence[JournalFacts], workers: Sequence[Any],
                   accepted_by_none: Any) -> list[Finding]:
    """Case 2. `accepted_by_none(urls, workers)`: topology.worker_stores's rule."""
    if not workers:
        return []  # worker_findings said so already
    accepted = sorted({s for w in workers for s in w.stores})
    out = []
    for j in journals:
        if not j.stores:
            continue
        missing = accepted_by_none(j.stores[:1], workers)
        target = accepted[0] if accepted else "a store the workers accept"
        if missing:
            out.append(Finding(
                "store-accepted-by-no-worker", Level.FAIL, f"journal {j.name}",
                f"its store {missing[0]} is written by no live worker (they accept "
                f"{', '.join(accepted) or 'none'}): its fragments stay on the coordinators' "
                f"disks and every persist task is refused (StoreNotAllowed)",
                f"set fragment.stores of {j.name} to {target} and `quire journals apply "
                f"-f SPEC`; or start a worker with QUIRE_WORKER_STORES={missing[0]}"))
    return out


def backlog_findings(backlog: Mapping[str, Any], failures: Mapping[str, Any], *, now: float,
                     max_age: float) -> list[Finding]:
    """`backlog` / `failures`: fragment_store.persist_status's PersistBacklog /
    PersistFailure by journal."""
    out = []
    for journal, f in sorted(failures.items()):
        name = "persist-refused" if f.reason == "store_not_allowed" else "persist-failing"
        out.append(Finding(name, Level.FAIL, f"journal {journal}",
                           f"{f.count} persist attempt(s) {f.reason.replace('_', ' ')} since "
                           f"{_hms(f.first)} (last {_hms(f.last)}, worker {f.worker or '?'}): "
                           f"{f.message}",
                           "fix the store or the workers' QUIRE_WORKER_STORES, then the "
                           "coordinators re-send the fragments by themselves"))
    for journal, b in sorted(backlog.items()):
        age = b.age(now)
        if age <= max_age or journal in failures:
            continue
        if b.fragments:
            out.append(Finding("persist-backlog", Level.FAIL, f"journal {journal}",
                               f"{b.bytes} bytes in {b.fragments} closed fragment(s) not in the "
                               f"store for {_age(age)} (since {_hms(b.oldest)})",
                               "check the workers on queue `persist` (their log, Flower) "
                               "and the store"))
        else:
            out.append(Finding("open-fragment-old", Level.WARN, f"journal {journal}",
                               f"its open fragment has held {b.bytes} bytes for {_age(age)} "
                               f"(since {_hms(b.oldest)}) without filling: it is persisted "
                               f"only once it rolls",
                               f"set fragment.flush_interval of {journal} (e.g. 1m) and "
                               f"`quire journals apply -f SPEC` to bound it"))
    if not out:
        out.append(Finding("persistence", Level.OK, "persistence",
                           f"no persist failure; no backlog older than {_age(max_age)}"))
    return out


# -- jobs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobFacts:
    name: str
    window: int
    delay: float
    suspended: bool
    next_window: int
    waiting_on: str = ""
    watermark: float = 0.0
    reason: str = ""
    note: str = ""
    swept: bool = True
    """The scheduler wrote a status for it (False: no sweep has seen it yet)."""


def job_findings(jobs: Sequence[JobFacts], *, now: float, grace: float) -> list[Finding]:
    """Case 1: a job's next window due (its end plus `delay`) longer than `grace` ago."""
    out = []
    for j in jobs:
        subject = f"job {j.name}"
        if j.suspended:
            out.append(Finding("job", Level.OK, subject, "suspended"))
            continue
        if not j.swept:
            out.append(Finding("job-not-scheduled", Level.WARN, subject,
                               "no scheduler sweep has seen it yet",
                               "run a worker on queue `jobs` and celery beat (quire up runs both)"))
            continue
        if j.note:
            out.append(Finding("job-selects-nothing", Level.WARN, subject, j.note,
                               f"quire jobs get {j.name}; fix its selector and apply it again"))
            continue
        due = j.next_window + j.window + j.delay
        late = now - due
        if late > grace:
            behind = (f"watermark {_hms(j.watermark)}, {_age(max(0.0, now - j.watermark))} "
                      f"behind" if j.watermark else "no watermark yet")
            why = j.reason or "no reason recorded (is the scheduler on queue `jobs` running?)"
            out.append(Finding("job-window-waiting", Level.FAIL, subject,
                               f"window {_hms(j.next_window)} due {_age(late)} ago waits on "
                               f"{j.waiting_on or '?'} ({behind}): {why}",
                               f"quire jobs runs {j.name}; mend what the reason names "
                               f"(quire journals list --stats shows each journal's backlog)"))
        else:
            out.append(Finding("job", Level.OK, subject,
                               f"next window {_hms(j.next_window)} "
                               + ("not due yet" if late <= 0 else f"due {_age(late)} ago")))
    return out


# -- certificates, clocks, kernel TLS ------------------------------------------------------

def ktls_finding(usable: bool, line: str) -> Finding:
    """Whether TLS could use the kernel's record layer here (protocol/ktls.py's line):
    informational, never a failure — the memory-BIO path serves TLS without it."""
    return Finding("ktls", Level.OK, "kernel TLS", line,
                   "" if usable else "optional: `modprobe tls`, and Python ≥ 3.12 with an "
                                     "OpenSSL 3 built with enable-ktls")


def cert_findings(certs: Mapping[str, float | str], *, now: float, warn_days: float = 30,
                  fail_days: float = 7) -> list[Finding]:
    """`certs`: path -> notAfter (unix s) or why it could not be read."""
    out = []
    for path, after in sorted(certs.items()):
        subject = f"certificate {path}"
        if isinstance(after, str):
            out.append(Finding("certificate-unreadable", Level.FAIL, subject, after,
                               "point the QUIRE_TLS_* / QUIRE_ETCD_* variable at a readable PEM"))
            continue
        left = after - now
        if left <= fail_days * 86400:
            what = "expired" if left <= 0 else f"expires in {_age(left)}"
            out.append(Finding("certificate-expiry", Level.FAIL, subject,
                               f"{what} ({_hms(after)})",
                               "issue a new one (quire up --secure renews its own CA's at "
                               "start; see docs/security.md) and restart its holders"))
        elif left <= warn_days * 86400:
            out.append(Finding("certificate-expiry", Level.WARN, subject,
                               f"expires in {_age(left)} ({_hms(after)})",
                               "renew it before then (docs/security.md)"))
        else:
            out.append(Finding("certificate", Level.OK, subject, f"valid until {_hms(after)}"))
    return out


def clock_findings(offsets: Mapping[str, float], *, max_skew: float) -> list[Finding]:
    """`offsets`: member -> its clock minus ours (seconds)."""
    out = []
    for who, skew in sorted(offsets.items()):
        if abs(skew) > max_skew:
            out.append(Finding("clock-skew", Level.FAIL, who,
                               f"its clock is {abs(skew):.1f}s {'ahead of' if skew > 0 else 'behind'} "
                               f"this host's: windows, marks and leases disagree",
                               "run NTP (chrony / systemd-timesyncd) on every host"))
    if offsets and not out:
        out.append(Finding("clock", Level.OK, "clocks",
                           f"{', '.join(sorted(offsets))} within {max_skew:g}s of this host"))
    return out


# -- a local cluster left behind -------------------------------------------------------------

@dataclass(frozen=True)
class Proc:
    pid: int
    command: str


@dataclass(frozen=True)
class LocalFacts:
    data_dir: str
    up_pid: int = 0
    """The pid `<data-dir>/env` names (0: no env file)."""
    up_alive: bool = False
    members: tuple[Proc, ...] = field(default_factory=tuple)
    """Processes working in the data dir (other than `quire up` itself)."""


def leftover_findings(local: LocalFacts) -> list[Finding]:
    """Case 3: members running in a data dir whose `quire up` is gone."""
    if local.up_alive:
        return [Finding("local-cluster", Level.OK, f"data dir {local.data_dir}",
                        f"quire up (pid {local.up_pid}) is running with "
                        f"{len(local.members)} member process(es)")]
    if not local.members:
        return []
    who = ("its quire up (pid %d) is dead" % local.up_pid if local.up_pid
           else "no quire up owns it")
    pids = " ".join(str(p.pid) for p in local.members)
    listing = "; ".join(f"{p.pid} {p.command[:60]}" for p in local.members[:6])
    return [Finding("leftover-local-cluster", Level.FAIL, f"data dir {local.data_dir}",
                    f"{len(local.members)} process(es) of a local cluster still run but {who}: "
                    f"{listing}",
                    f"kill {pids}   (then quire up --data-dir {local.data_dir} starts it again)")]
