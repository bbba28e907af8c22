"""Jobs end to end: real etcd, Redis, coordinators, two Celery workers and two beats.

Three journals, 10-second windows, the built-in `window_counts` Celery target writing
identified appends to one output journal. One test walks the phases in one cluster (a
cluster takes a while to start on a loaded machine):

1. runs start only once all three journals are persisted past the window's end, and each
   window runs exactly once (one attempt, one output row per journal) although two beats
   and two workers race for it;
2. pausing the coordinator of one journal holds windows back, and `quire jobs runs` names
   that journal; resumed, the held window runs;
3. kill -9 of the worker running a window (after its output was appended, before the run
   was recorded): the lease expires, the run is retried on the other worker, and the
   output holds the window's rows once;
4. backfill of 5 past windows runs 5 runs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from protocol.job import RunState, window_of
from tests.jobs.jobs_support import JOURNALS, OUTPUT, WINDOW, Cluster, Writer, wait_until

pytestmark = pytest.mark.timeout(600)

TARGET = {"kind": "celery", "name": "workers.jobs_targets.window_counts"}


def _job(name: str, **extra: object) -> dict[str, object]:
    return {"name": name, "selector": "topic=job-events", "window": f"{WINDOW}s",
            "target": TARGET, "output": OUTPUT, "retries": 3, "backoff": "1s", **extra}


def _status(cluster: Cluster, job: str):  # type: ignore[no-untyped-def]
    from tests.workers.workers_support import _run
    from topology.etcd import connect
    from topology.jobs import get_status

    async def body():  # type: ignore[no-untyped-def]
        c = await connect(cluster.etcd.url)
        try:
            return await get_status(c, cluster.root, job)
        finally:
            await c.close()

    return _run(body())


def _succeeded(cluster: Cluster, job: str) -> list:  # type: ignore[type-arg]
    return [r for r in cluster.runs(job) if r.state == RunState.SUCCEEDED]


def _check_once(cluster: Cluster, job: str) -> None:
    """Every succeeded run of `job` has exactly one output row per journal with messages,
    and each row counts exactly the lines in the run's offset range."""
    rows = [r for r in cluster.output_rows(OUTPUT) if r["job"] == job]
    seen = Counter((r["window_start"], r["journal"]) for r in rows)
    dupes = {k: n for k, n in seen.items() if n > 1}
    assert not dupes, f"{job}: rows written more than once: {dupes}"
    by_key = {(r["window_start"], r["journal"]): r["messages"] for r in rows}
    for run in _succeeded(cluster, job):
        assert run.ranges is not None
        for journal, (begin, end) in run.ranges.items():
            expect = cluster.lines_in(journal, begin, end)
            assert by_key.get((run.window_start, journal), 0) == expect, \
                (job, run.window_start, journal, begin, end)


def test_jobs_windows_run_once_after_persistence(etcd, etcd_root, redis_db, tmp_path) -> None:
    cluster = Cluster(etcd=etcd, root=etcd_root, redis_url=redis_db.url, tmp=tmp_path)
    writer = None
    try:
        cluster.start()
        started = time.time()
        cluster.start_worker(concurrency=10, queues=("pulse",))
        for _ in range(2):
            cluster.start_worker()
            cluster.start_beat()
        writer = Writer(cluster.endpoints, JOURNALS)
        writer.start()

        # -- 1. each window once, only after all three journals are persisted past it --
        cluster.apply_job(_job("counts"))
        wait_until(lambda: len(_succeeded(cluster, "counts")) >= 2, 120, "two windows of counts")
        r = redis_db.client
        for run in cluster.runs("counts"):
            # The run was created after every journal's watermark passed the window's end.
            assert run.created >= run.window_end
            assert set(run.ranges or {}) == set(JOURNALS)
        runs = sorted(cluster.runs("counts"), key=lambda x: x.window_start)
        for a, b in zip(runs, runs[1:], strict=False):  # consecutive windows tile each journal
            if b.window_start == a.window_end and a.ranges and b.ranges:
                assert all(a.ranges[j][1] == b.ranges[j][0] for j in JOURNALS)

        # -- 2. a journal whose coordinator is stopped holds the window back -------------
        held_journal, holder = cluster.held()
        others = [j for j in JOURNALS if j != held_journal]
        writer.paused.add(held_journal)
        time.sleep(0.5)  # the writer's in-flight append to it finishes
        holder.pause()
        paused_at = time.time()
        try:
            status = wait_until(
                lambda: (s := _status(cluster, "counts")) and s.waiting_on == held_journal
                and s.next_window + WINDOW <= time.time() - 5 and s, 60,
                f"the next window to be held back by the paused journal; last "
                f"{_status(cluster, 'counts')}")
            held = status.next_window
            assert held + WINDOW > paused_at - WINDOW
            assert all(run.window_start < held for run in cluster.runs("counts"))
            out = cluster.cli("jobs", "runs", "counts").stdout
            assert f"waits on {held_journal}" in out, out
            wms = {k.decode(): float(v) for k, v in r.hgetall("quire:watermarks").items()}
            assert wms[held_journal] < held + WINDOW <= min(wms[j] for j in others), wms
        finally:
            holder.resume()
        resumed_at = time.time()
        writer.paused.discard(held_journal)
        run = wait_until(lambda: next((x for x in _succeeded(cluster, "counts")
                                       if x.window_start == held), None), 90,
                         "the held window to run once its journal is persisted")
        assert run.created >= resumed_at

        # Two beats, two workers: every window so far ran exactly once, at its first attempt.
        assert all(x.attempt == 1 for x in _succeeded(cluster, "counts")), cluster.runs("counts")
        _check_once(cluster, "counts")

        # -- 3. kill -9 the worker running a window: retried, output once ---------------
        cluster.apply_job(_job("slow", args={"hold_after": 6}, max_concurrent=1))
        running = wait_until(lambda: next((x for x in cluster.runs("slow")
                                           if x.state == RunState.RUNNING), None), 90,
                             "a run of slow to start")
        pid = int(running.worker.rpartition(":")[2])
        victim = next(w for w in cluster.workers if w.pid == pid)
        # Its output is appended right away; then it holds for 6 s: kill it in that time.
        wait_until(lambda: any(row["job"] == "slow" and row["window_start"] == running.window_start
                               for row in cluster.output_rows(OUTPUT)), 30, "slow's output")
        os.kill(pid, signal.SIGKILL)
        victim.kill()
        retried = wait_until(lambda: next((x for x in _succeeded(cluster, "slow")
                                           if x.window_start == running.window_start), None), 90,
                             "the killed run to be retried and succeed")
        assert retried.attempt >= 2
        assert "worker lost" in retried.attempts[0].error
        assert retried.worker != running.worker
        _check_once(cluster, "slow")
        cluster.cli("jobs", "delete", "slow")

        # -- 4. backfill of 5 past windows runs 5 runs ---------------------------------------
        first = window_of(started, WINDOW) + WINDOW  # pulses (marks) began before this
        last = first + 5 * WINDOW
        wait_until(lambda: time.time() > last + 1, 120, "five whole windows in the past")
        # Applied only now: its own schedule starts at the window it is created in, past
        # `last`, so none of the five is also the scheduler's (steps 1-3 may end early
        # now that quiet windows complete by themselves, #51).
        cluster.apply_job(_job("late", max_concurrent=2))
        out = cluster.cli("jobs", "backfill", "late", "--from", str(first), "--to", str(last))
        assert "created 5 run(s)" in out.stdout, out.stdout
        done = wait_until(lambda: (b := [x for x in _succeeded(cluster, "late") if x.backfill])
                          and len(b) == 5 and b, 120, "five backfilled runs")
        assert sorted(x.window_start for x in done) == list(range(first, last, WINDOW))
        _check_once(cluster, "late")
        listing = cluster.cli("jobs", "list").stdout
        assert "late" in listing and "counts" in listing
        assert not writer.errors[:1], writer.errors[:3]

        # The watermark column of `quire journals list --stats`.
        stats = cluster.cli("--broker", cluster.endpoints[0], "journals", "list", "--stats",
                            "-o", "json", etcd=False, QUIRE_REDIS_URL=redis_db.url).stdout
        marks = {row["journal"]: row["watermark"] for row in map(json.loads, stats.splitlines())}
        assert all(marks[j] > last for j in JOURNALS), marks
    except BaseException:
        print(cluster.dump())
        raise
    finally:
        if writer is not None:
            writer.stop()
        cluster.close()
