"""Issue #51, case 1: a job over quiet journals with the spec's defaults completes every
window by itself.

Three journals with the spec's defaults (no `flush_interval`, a 60 s refresh) and a
2 KiB fragment length, written a few hundred bytes a second (one) and a few dozen (two
that never fill a fragment), then not at all. Nothing in the spec closes their open
fragments; the scheduler asks their primary to (workers/jobs_roll.py). Every window
from the job's start to the last write runs once, and the output counts every line the
journals hold.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from protocol import FragmentSpec, LabelSet
from protocol.job import RunState
from tests.jobs.jobs_support import Cluster, wait_until
from workers.watermark import MARKS_PREFIX

pytestmark = pytest.mark.timeout(400)

QUIET = ("quiet/in/a", "quiet/in/b", "quiet/in/c")
OUT = "quiet/out/counts"
WINDOW = 10
TARGET = {"kind": "celery", "name": "workers.jobs_targets.window_counts"}


def _line(journal: str, n: int) -> bytes:
    return (json.dumps({"key": f"k{n % 3}", "n": n, "j": journal[-1]}) + "\n").encode()


def test_quiet_journals_complete_every_window_once(etcd, etcd_root, redis_db, tmp_path) -> None:
    cluster = Cluster(etcd=etcd, root=etcd_root, redis_url=redis_db.url, tmp=tmp_path)
    try:
        from quire.client import SyncClient

        cluster.start_coordinator("coord-a", 8)
        cluster.client = SyncClient(cluster.endpoints, retry_timeout=30)
        defaults = FragmentSpec(length=2048, stores=(cluster.store,))
        assert defaults.flush_interval == 0
        cluster.apply_journals(QUIET, LabelSet.of({"topic": "quiet"}), fragment=defaults)
        cluster.apply_journals((OUT,), LabelSet.of({"topic": "quiet-out"}), fragment=defaults)
        cluster.start_worker(concurrency=4, queues=("pulse",))
        cluster.start_worker(concurrency=4)
        cluster.start_beat()
        cluster.apply_job({"name": "quiet", "selector": "topic=quiet", "window": f"{WINDOW}s",
                           "target": TARGET, "output": OUT, "retries": 3, "backoff": "1s"})
        start = _job_start(cluster)
        # The job's first window begins at the first mark at or after its start: write
        # only once every journal has one, so the windows hold everything written.
        r = redis_db.client
        wait_until(lambda: all(r.zrangebyscore(MARKS_PREFIX + j, start, "+inf", 0, 1)
                               for j in QUIET), 60, "a pulse mark past the job's start")

        # -- write: ~250 B/s to a, ~25 B/s to b and c, for ~25 s; then nothing ---------
        stop = threading.Event()
        sent: Counter[str] = Counter()
        n = 0
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            for j in QUIET:
                if j == QUIET[0] or n % 10 == 0:
                    cluster.client.append(j, _line(j, n))
                    sent[j] += 1
            n += 1
            stop.wait(0.25)
        last_write = time.time()
        heads = {j: cluster.client.append(j, b"").end for j in QUIET}
        assert heads[QUIET[1]] < 2048 and heads[QUIET[2]] < 2048, heads  # never filled one
        last_window = int(last_write // WINDOW) * WINDOW

        def done() -> bool:
            runs = [x for x in cluster.runs("quiet") if x.window_start <= last_window]
            return bool(runs) and all(x.state == RunState.SUCCEEDED for x in runs) \
                and max(x.window_start for x in runs) == last_window

        try:
            wait_until(done, 120, f"every window through {last_window} to succeed")
        except TimeoutError:
            print(cluster.cli("jobs", "list", check=False).stdout)
            raise
        runs = sorted((x for x in cluster.runs("quiet") if x.window_start <= last_window),
                      key=lambda x: x.window_start)
        starts = [x.window_start for x in runs]
        assert starts == list(range(starts[0], last_window + 1, WINDOW)), starts
        assert all(x.rerun == 0 for x in runs)
        for j in QUIET:  # the windows tile each journal from 0 to its head
            spans = [x.ranges[j] for x in runs if x.ranges]
            assert len(spans) == len(runs)
            assert spans[0][0] == 0 and spans[-1][1] == heads[j], (j, spans, heads)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), (j, spans)

        rows = [row for row in cluster.output_rows(OUT) if row["job"] == "quiet"]
        once = Counter((row["window_start"], row["journal"]) for row in rows)
        assert all(v == 1 for v in once.values()), once
        counted = Counter()
        for row in rows:
            counted[row["journal"]] += row["messages"]
        assert dict(counted) == dict(sent), (counted, sent)
        for j in QUIET:
            held = cluster.client.read_all(j, 0)
            assert sum(1 for line in held.splitlines() if line.strip()) == sent[j]

        # Mended by itself: `quire doctor` finds nothing wrong, every queue consumed.
        proc = cluster.cli("doctor", "--format", "json", "--data-dir", str(tmp_path / "none"),
                           "--redis", redis_db.url, check=False)
        report = json.loads(proc.stdout)
        assert proc.returncode == 0 and report["ok"], report
        assert any(f["name"] == "worker-queues" for f in report["findings"]), report
    except BaseException:
        print(cluster.dump(60))
        raise
    finally:
        cluster.close()


def _job_start(cluster: Cluster) -> int:
    from tests.workers.workers_support import _run
    from topology.etcd import connect
    from topology.jobs import get_job

    async def body() -> int:
        c = await connect(cluster.etcd.url)
        try:
            spec, _ = await get_job(c, cluster.root, "quiet")
            return int(spec.start)
        finally:
            await c.close()

    return _run(body())
