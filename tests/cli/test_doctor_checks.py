"""tools/doctor_checks.py: the verdicts of `quire doctor` from plain facts (pure)."""

from __future__ import annotations

from fragment_store.persist_status import PersistBacklog, PersistFailure
from tools.doctor_checks import (
    CoordinatorFacts,
    JobFacts,
    JournalFacts,
    Level,
    LocalFacts,
    Proc,
    backlog_findings,
    cert_findings,
    clock_findings,
    coordinator_findings,
    exit_ok,
    job_findings,
    leftover_findings,
    route_findings,
    store_findings,
    worker_findings,
)
from topology.worker_stores import WorkerStores, stores_accepted_by_none

NOW = 1_800_000_000.0
OURS = "file:///data/fragments/"


def names(findings) -> list[str]:  # noqa: ANN001
    return [f.name for f in findings if f.level is not Level.OK]


def test_case_1_a_job_window_due_past_the_grace() -> None:
    job = JobFacts(name="counts", window=10, delay=0, suspended=False, next_window=int(NOW) - 400,
                   waiting_on="h/in/b", watermark=NOW - 410,
                   reason="h/in/b: bytes [0 B, 1.7 KB) acknowledged since 00:09:05 are not persisted")
    found = job_findings([job], now=NOW, grace=300)
    assert names(found) == ["job-window-waiting"] and not exit_ok(found)
    assert "waits on h/in/b" in found[0].message and "1.7 KB" in found[0].message
    assert found[0].mend.startswith("quire jobs runs counts")
    assert exit_ok(job_findings([job], now=NOW, grace=600))  # not late enough yet
    suspended = JobFacts(name="s", window=10, delay=0, suspended=True, next_window=0)
    assert exit_ok(job_findings([suspended], now=NOW, grace=1))


def test_case_2_a_store_no_worker_accepts_and_refused_persists() -> None:
    workers = [WorkerStores(worker="w@h", stores=(OURS,), restricted=True, auth=True)]
    journals = [JournalFacts("ok", 1, 1, 1, (OURS,)),
                JournalFacts("elsewhere", 1, 1, 1, ("file:///some/dir/",))]
    found = store_findings(journals, workers, stores_accepted_by_none)
    assert names(found) == ["store-accepted-by-no-worker"]
    assert "elsewhere" in found[0].subject and OURS in found[0].message
    assert "QUIRE_WORKER_STORES=file:///some/dir/" in found[0].mend
    unrestricted = [WorkerStores(worker="w@h", stores=(OURS,), restricted=False)]
    assert store_findings(journals, unrestricted, stores_accepted_by_none) == []
    refused = {"elsewhere": PersistFailure(reason="store_not_allowed", message="not a store",
                                           count=3, first=NOW - 60, last=NOW - 1, worker="w@h")}
    found = backlog_findings({}, refused, now=NOW, max_age=300)
    assert names(found) == ["persist-refused"]


def test_backlog_closed_fragments_fail_an_old_open_fragment_warns() -> None:
    backlog = {"a": PersistBacklog(bytes=5000, fragments=2, oldest=NOW - 900),
               "b": PersistBacklog(bytes=100, fragments=0, oldest=NOW - 900),
               "c": PersistBacklog(bytes=100, fragments=1, oldest=NOW - 10)}
    found = backlog_findings(backlog, {}, now=NOW, max_age=300)
    assert [(f.name, f.level) for f in found] == [("persist-backlog", Level.FAIL),
                                                  ("open-fragment-old", Level.WARN)]
    assert "flush_interval" in found[1].mend


def test_case_3_members_without_their_quire_up() -> None:
    procs = (Proc(11, "/usr/bin/etcd --name etcd"), Proc(12, "redis-server 127.0.0.1:1"))
    found = leftover_findings(LocalFacts("/d", up_pid=9, up_alive=False, members=procs))
    assert names(found) == ["leftover-local-cluster"]
    assert "pid 9" in found[0].message and found[0].mend.startswith("kill 11 12")
    assert exit_ok(leftover_findings(LocalFacts("/d", up_pid=9, up_alive=True, members=procs)))
    assert leftover_findings(LocalFacts("/d")) == []


def test_services_routes_certificates_clocks() -> None:
    assert names(coordinator_findings([])) == ["coordinators"]
    found = coordinator_findings([CoordinatorFacts("z#a", "h:1"),
                                  CoordinatorFacts("z#b", "h:2", error="refused"),
                                  CoordinatorFacts("z#c", "h:3", health="full: spool full")])
    assert names(found) == ["coordinator", "coordinator"]
    assert names(worker_findings([])) == ["workers"]
    routes = route_findings([JournalFacts("j", 3, 2, 2), JournalFacts("k", 1, 1, None),
                             JournalFacts("s", 0, 0, None)], coordinators=2)
    assert names(routes) == ["journal-route-incomplete", "journal-route-not-advertised"]
    assert "--coordinators 3" in routes[0].mend
    certs = cert_findings({"/a.pem": NOW + 3 * 86400, "/b.pem": NOW + 20 * 86400,
                           "/c.pem": NOW + 400 * 86400, "/d.pem": "cannot read"}, now=NOW)
    assert [(f.name, f.level) for f in certs] == [
        ("certificate-expiry", Level.FAIL), ("certificate-expiry", Level.WARN),
        ("certificate", Level.OK), ("certificate-unreadable", Level.FAIL)]
    assert names(clock_findings({"redis": 0.2, "coordinator z#a": 9.0}, max_skew=5)) == ["clock-skew"]


def test_queues_without_a_consumer_and_workers_that_do_not_answer() -> None:
    from tools.doctor_checks import queue_findings

    w = WorkerStores(worker="w@h", stores=(OURS,), pid=7)
    ok = queue_findings({"w@h": ["celery", "index", "jobs", "persist", "pulse"]}, [w], jobs=True)
    assert exit_ok(ok) and ok[0].name == "worker-queues"
    found = queue_findings({"w@h": ["index", "persist"]}, [w], jobs=True)
    assert [f.subject for f in found] == ["queue pulse", "queue jobs"]
    assert "-Q pulse" in found[0].mend
    assert exit_ok(queue_findings({"w@h": ["index", "persist", "pulse"]}, [w], jobs=False))
    found = queue_findings({}, [w], jobs=False)
    assert names(found)[-1] == "worker-not-answering" and "pid 7" in found[-1].mend
    skipped = queue_findings("NoPermissionError", [w], jobs=False)
    assert exit_ok(skipped) and skipped[0].level is Level.WARN


def test_ktls_is_reported_never_failed() -> None:
    from tools.doctor_checks import ktls_finding

    off = ktls_finding(False, "kTLS: unavailable (the kernel has no tls ULP)")
    assert off.level is Level.OK and off.name == "ktls" and "modprobe tls" in off.mend
    assert "unavailable" in off.message
    on = ktls_finding(True, "kTLS: available (x)")
    assert on.level is Level.OK and on.mend == ""
