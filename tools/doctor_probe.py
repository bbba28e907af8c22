"""`quire doctor`'s IO: it gathers the facts tools/doctor_checks.py judges — etcd (quorum,
access, members, journals, routes, jobs, the workers' store announcements), Redis
(reachability, its clock, persistence backlog and failures), each coordinator (Hello),
the TLS certificates the settings name, and the local data dir's processes — and
returns the findings. A service that cannot be reached is a finding, and the checks
that needed it are skipped (said once), never an exception.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.config import Settings
from protocol.ktls import ktls_status
from tools.doctor_checks import (
    CoordinatorFacts,
    Finding,
    JobFacts,
    JournalFacts,
    Level,
    LocalFacts,
    Proc,
    backlog_findings,
    cert_findings,
    clock_findings,
    coordinator_findings,
    job_findings,
    ktls_finding,
    leftover_findings,
    queue_findings,
    route_findings,
    service_finding,
    store_findings,
    worker_findings,
)

__all__ = ["Limits", "gather", "local_facts"]


@dataclass(frozen=True)
class Limits:
    timeout: float = 3.0
    """Seconds for each service to answer."""
    job_grace: float = 300.0
    backlog_age: float = 300.0
    max_skew: float = 5.0


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# -- the local data dir (case 3) --------------------------------------------------------------

_SHELLS = {"bash", "sh", "zsh", "fish", "dash", "ksh", "tmux", "screen", "less", "vi", "vim"}


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def local_facts(data_dir: str | os.PathLike[str]) -> LocalFacts:
    """Who owns `data_dir` (its `env` file's `quire up` pid) and which processes work in
    it (their cwd is inside it, as every member `quire up` starts has: tools/local_cluster.py);
    shells and this command's own ancestors are not members."""
    from protocol.discovery import ENV_FILE, read_env_file

    root = Path(data_dir).expanduser().absolute()
    found = read_env_file(root / ENV_FILE)
    up_pid = found.pid if found is not None else 0
    up_alive = bool(found is not None and found.running)
    mine = _ancestors()
    members = []
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in mine or pid == up_pid:
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cwd != root and root not in cwd.parents:
            continue
        if not argv or not argv[0] or os.path.basename(argv[0].decode(errors="replace")) in _SHELLS:
            continue
        members.append(Proc(pid, " ".join(a.decode(errors="replace") for a in argv if a)))
    return LocalFacts(data_dir=str(root), up_pid=up_pid, up_alive=up_alive,
                      members=tuple(sorted(members, key=lambda p: p.pid)))


# -- certificates ------------------------------------------------------------------------------

def _cert_paths(s: Settings, data_dir: Path) -> list[str]:
    paths = [p for p in (s.tls_cert, s.tls_ca, s.etcd_ca, s.etcd_cert) if p]
    tls = data_dir / "tls"
    if tls.is_dir():
        for p in sorted(tls.glob("*.pem")):
            try:
                if b"BEGIN CERTIFICATE" in p.read_bytes()[:4096]:
                    paths.append(str(p))
            except OSError:
                continue
    return sorted(set(paths))


def _certs(paths: list[str]) -> dict[str, float | str]:
    from protocol.tls import cert_not_after

    out: dict[str, float | str] = {}
    for p in paths:
        try:
            out[p] = cert_not_after(p)
        except ValueError as exc:
            out[p] = str(exc)
    return out


# -- services ------------------------------------------------------------------------------------

def _redis_name(url: str) -> str:
    """`redis host:port/db`: no user, password or query."""
    return "redis " + url.rpartition("@")[2].split("://")[-1].split("?")[0]


def _redis(s: Settings, limits: Limits, now: Callable[[], float]) -> tuple[Any, list[Finding], dict[str, float]]:
    import redis

    offsets: dict[str, float] = {}
    try:
        client = redis.Redis.from_url(s.redis_url, socket_timeout=limits.timeout,
                                      socket_connect_timeout=limits.timeout)
        client.ping()
        before = now()
        sec, usec = client.time()
        after = now()
        offsets[_redis_name(s.redis_url)] = sec + usec / 1e6 - (before + after) / 2
    except redis.RedisError as exc:
        return None, [service_finding(
            "redis", _redis_name(s.redis_url), _why(exc), "",
            "start redis-server (quire up runs one), or set QUIRE_REDIS_URL (with its "
            "user and password when the cluster has auth)")], offsets
    return client, [service_finding("redis", _redis_name(s.redis_url), None,
                                    "answers PING", "")], offsets


async def _etcd(s: Settings, root: str, limits: Limits) -> tuple[Any, list[Finding]]:
    from protocol.discovery import effective_env
    from topology.etcd import connect
    from topology.etcd_client import EtcdTLS
    from aetcd import rpc

    subject = f"etcd {s.etcd_url}"
    mend = ("start etcd (quire up runs one), or set QUIRE_ETCD_URL; with auth, "
            "QUIRE_ETCD_CA/CERT/KEY for a user granted the cluster's prefix")
    try:
        client = await asyncio.wait_for(
            connect(s.etcd_url, probe=limits.timeout, timeout=limits.timeout,
                    tls=EtcdTLS.from_env(effective_env()), root=root), limits.timeout * 2)
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        return None, [service_finding("etcd", subject, _why(exc), "", mend)]
    try:
        members = await client.clusterstub.MemberList(
            rpc.MemberListRequest(linearizable=True), timeout=limits.timeout,
            metadata=client.metadata)
        status = await client.maintenancestub.Status(rpc.StatusRequest(), timeout=limits.timeout,
                                                     metadata=client.metadata)
    except Exception as exc:  # noqa: BLE001
        await client.close()
        return None, [service_finding("etcd", subject, f"no quorum: {_why(exc)}", "",
                                      "bring a majority of etcd members back (etcdctl "
                                      "endpoint status --cluster)")]
    n = len(members.members)
    leader = "a leader" if status.leader else "NO leader"
    msg = (f"{n} member(s), {leader}, quorum (a linearizable read answered); access to "
           f"{root}/ granted")
    level = Level.OK if status.leader else Level.FAIL
    return client, [Finding("etcd", level, subject, msg,
                            "" if status.leader else "bring a majority of etcd members back")]


def _hello(endpoint: str, timeout: float, ssl: Any, token: str) -> str | None:
    from tools.local_cluster import hello_probe

    try:
        return None if hello_probe(endpoint, timeout, ssl=ssl, token=token) \
            else "closed without answering"
    except OSError as exc:
        return _why(exc)


async def _coordinators(s: Settings, ks: Any, limits: Limits) -> list[CoordinatorFacts]:
    from protocol.credentials import current_token, settings_token
    from protocol.tls import settings_client_ssl

    try:
        ssl = settings_client_ssl(s)
        token = current_token(settings_token(s))
    except Exception as exc:  # noqa: BLE001 - unreadable TLS files: every probe fails alike
        ssl, token, bad = None, "", _why(exc)
    else:
        bad = None
    out = []
    for pid, m in sorted(ks.members.items(), key=lambda kv: str(kv[0])):
        who = f"{pid.zone}#{pid.suffix}" if hasattr(pid, "zone") else str(pid)
        error = bad or await asyncio.to_thread(_hello, m.spec.endpoint, limits.timeout, ssl, token)
        out.append(CoordinatorFacts(member=who, endpoint=m.spec.endpoint, health=m.spec.health,
                                    exiting=m.spec.exiting, error=error))
    return out


def _journals(ks: Any) -> list[JournalFacts]:
    out = []
    for name, entry in sorted(ks.journals.items()):
        spec = entry.spec
        assigns = ks.assignments(name)
        primary = next((a for a in assigns if a.slot == 0), None)
        route = len(primary.value.members) if primary is not None and primary.value is not None \
            else None
        out.append(JournalFacts(name=name, desired=spec.desired_replication(),
                                assigned=len(assigns), route=route,
                                stores=tuple(spec.fragment.stores)))
    return out


async def _jobs(client: Any, root: str) -> list[JobFacts]:
    from topology.jobs import get_status, list_jobs

    out = []
    for spec, _ in await list_jobs(client, root):
        st = await get_status(client, root, spec.name)
        out.append(JobFacts(name=spec.name, window=spec.window, delay=spec.delay,
                            suspended=bool(spec.suspend), next_window=st.next_window if st else 0,
                            waiting_on=st.waiting_on if st else "",
                            watermark=st.watermark if st else 0.0,
                            reason=st.reason if st else "", note=st.note if st else "",
                            swept=st is not None))
    return out


def _queues(s: Settings, limits: Limits) -> dict[str, list[str]] | str:
    """Celery node -> the queues it consumes, asked over the broker; or why not."""
    from tools.services import celery_client

    app = celery_client(s.redis_url)
    app.conf.update(broker_connection_retry=False, broker_connection_max_retries=1,
                    broker_connection_timeout=limits.timeout)
    try:
        replies = app.control.inspect(timeout=min(2.0, limits.timeout)).active_queues() or {}
    except Exception as exc:  # noqa: BLE001 - a finding, not a crash
        return _why(exc)
    finally:
        app.close()
    return {node: sorted(q.get("name", "") for q in qs) for node, qs in replies.items()}


async def _cluster(s: Settings, root: str, limits: Limits, r: Any, redis_offset: float,
                   now: Callable[[], float]) -> tuple[list[Finding], dict[str, float]]:
    from fragment_store.persist_status import read_backlog, read_failures
    from topology.keyspace import KeySpace
    from topology.worker_stores import list_worker_stores, stores_accepted_by_none

    client, out = await _etcd(s, root, limits)
    offsets: dict[str, float] = {}
    if client is None:
        out.append(Finding("skipped", Level.WARN, "coordinators, journals, workers, jobs",
                           "not checked: etcd did not answer", ""))
        return out, offsets
    try:
        async with KeySpace(client, root) as ks:
            coords = await _coordinators(s, ks, limits)
            journals = _journals(ks)
        workers = await list_worker_stores(client, root)
        jobs = await _jobs(client, root)
    finally:
        await client.close()
    out += coordinator_findings(coords)
    out += worker_findings(workers)
    if r is not None and workers:
        queues = await asyncio.to_thread(_queues, s, limits)
        out += queue_findings(queues, workers, jobs=bool(jobs))
    out += route_findings(journals, len(coords))
    out += store_findings(journals, workers, stores_accepted_by_none)
    backlog = failures = None
    if r is not None:
        import redis

        try:
            backlog, failures = read_backlog(r), read_failures(r)
        except redis.RedisError as exc:
            out.append(Finding("skipped", Level.WARN, "persistence backlog",
                               f"not checked: Redis refused the read of quire:persist-*: "
                               f"{_why(exc)}", "run quire doctor with the workers' "
                               "QUIRE_REDIS_URL (a user that may read quire:persist-*)"))
    if backlog is not None and failures is not None:
        t = now()
        out += backlog_findings(backlog, failures, now=t, max_age=limits.backlog_age)
        redis_now = t + redis_offset
        for b in backlog.values():  # a coordinator's report stamped in our future
            if b.coordinator and b.updated - redis_now > limits.max_skew:
                offsets[f"coordinator {b.coordinator}"] = b.updated - redis_now
    elif r is None:
        out.append(Finding("skipped", Level.WARN, "persistence backlog",
                           "not checked: Redis did not answer", ""))
    out += job_findings(jobs, now=now(), grace=limits.job_grace)
    return out, offsets


def gather(s: Settings, data_dir: str | os.PathLike[str], limits: Limits,
           root: str | None = None, now: Callable[[], float] = time.time) -> list[Finding]:
    """Every check, in the order an operator reads them."""
    root = (root or s.etcd_root).rstrip("/")
    data = Path(data_dir).expanduser().absolute()
    findings = leftover_findings(local_facts(data))
    r, redis_findings, offsets = _redis(s, limits, now)
    cluster, coordinator_offsets = asyncio.run(
        _cluster(s, root, limits, r, next(iter(offsets.values()), 0.0), now))
    if r is not None:
        r.close()
    findings += cluster[:1] + redis_findings + cluster[1:]
    findings += cert_findings(_certs(_cert_paths(s, data)), now=now())
    findings += clock_findings({**offsets, **coordinator_offsets}, max_skew=limits.max_skew)
    status = ktls_status()
    findings.append(ktls_finding(status.usable, status.line()))
    return findings
