"""The Dask streaming query (spark/dask_stream.py, the job spark/jobs/dask_minute_counts.py)
on a Dask distributed scheduler and two workers on loopback, against the stream cluster
(etcd, a coordinator, the Celery worker persisting fragments to a file store).

Two waves of events: the first counted by a driver that is SIGKILLed at the worst
moment — micro-batch 1's counts appended, its commit not yet in the checkpoint
(QUIRE_SINK_FAULT=hang-at-commit) — and the second appended while no driver runs. A
driver started again on the checkpoint re-runs batch 1 over the same offsets, then
counts the rest: the summed counts equal the model exactly (nothing lost, nothing twice).
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.stream_helpers import make_journals, wait_for

pytestmark = pytest.mark.timeout(600)

SOURCES = ["dask-stream/events/part-000", "dask-stream/events/part-001"]
OUT = "dask-stream/minute-counts"
Counts = collections.Counter[tuple[str, str]]


def append_wave(client: Any, first: int, count: int, want: Counts) -> None:
    for i in range(first, first + count, 3):
        chunk = []
        for n in range(i, min(i + 3, first + count)):
            minute = f"2026-01-01T00:{n % 7:02d}:00Z"
            chunk.append({"key": f"user-{n % 3}", "ts": minute.replace(":00Z", f":{n % 60:02d}Z")})
            want[(minute, chunk[-1]["key"])] += 1
        client.append(SOURCES[(i // 3) % 2], b"".join(json.dumps(e).encode() + b"\n"
                                                       for e in chunk))


def output(client: Any) -> tuple[Counts, list[int]]:
    got: Counts = collections.Counter()
    batches = []
    for line in client.read_all(OUT).splitlines():
        row = json.loads(line)
        got[(row["minute"], row["key"])] += row["events"]
        batches.append(row["batch"])
    return got, batches


def test_dask_stream_restarted_driver_counts_every_event_once(
        stream_cluster: Any, tmp_path: Path) -> None:
    from quire.client import SyncClient
    from tools.services import Service
    from tools.services.dask_cluster import DaskCluster

    brokers = ",".join(stream_cluster.endpoints)
    want: Counts = collections.Counter()
    faults = tmp_path / "faults"
    with SyncClient(stream_cluster.endpoints) as client, \
            DaskCluster(2, workdir=tmp_path / "dask") as dask:
        make_journals(client, stream_cluster.store_url, SOURCES, topic="dask-stream-events")
        append_wave(client, 0, 240, want)
        argv = [sys.executable, "-m", "spark.jobs.dask_minute_counts",
                "--scheduler", dask.scheduler_address, "--brokers", brokers,
                "--selector", "topic=dask-stream-events", "--out-journal", OUT,
                "--checkpoint", str(tmp_path / "checkpoint"), "--max-bytes-per-trigger", "2048",
                "--trigger-seconds", "0.2"]
        first = Service("dask-stream-driver-1", argv, workdir=tmp_path / "driver-1",
                        env={"QUIRE_SINK_FAULT": f"hang-at-commit:{faults}:1"})
        first.start()
        try:
            wait_for(lambda: (faults / "batch-1.committed").exists() or not first.running,
                     timeout=300, what="micro-batch 1's appends")
            assert first.running, first.log_tail(60)
            batch1, _ = output(client)
            assert sum(batch1.values()) > 0  # batches 0 and 1 appended their counts
        finally:
            first.kill()  # SIGKILL: batch 1 appended, not committed in the checkpoint
        assert not (tmp_path / "checkpoint" / "commits" / "1").exists()

        append_wave(client, 240, 150, want)
        second = Service("dask-stream-driver-2", [*argv, "--until-idle"],
                         workdir=tmp_path / "driver-2")
        second.start()
        try:
            wait_for(lambda: not second.running, timeout=300,
                     what="the restarted driver to finish")
            log = second.log_text()
            assert second.returncode == 0, second.log_tail(60)
        finally:
            second.stop()  # exited by itself: reaped and no longer tracked as live
        got, batches = output(client)
    assert "micro-batch 1 (re-run: planned by an earlier driver)" in log
    assert got == want  # every event counted once: the re-run batch landed once
    assert len(set(batches)) > 2 and sorted(set(batches)) == list(range(max(batches) + 1))


def test_checkpoint_rejects_a_malformed_offsets_file(tmp_path: Path) -> None:
    from spark.dask_checkpoint import Checkpoint, CheckpointError, PlannedBatch

    ck = Checkpoint(tmp_path / "ck")
    assert ck.last_planned() is None
    ck.plan(PlannedBatch(0, {}, {"topics/a": 10}))
    assert Checkpoint(tmp_path / "ck").query_id == ck.query_id
    assert ck.last_planned() == PlannedBatch(0, {}, {"topics/a": 10})
    (tmp_path / "ck" / "offsets" / "1").write_text('{"start": {"topics/a": 10}, "end": {"topics/a": -1}}')
    with pytest.raises(CheckpointError, match="offsets/1.*offset must be an integer >= 0"):
        ck.last_planned()
    (tmp_path / "ck" / "offsets" / "1").write_text("{not json")
    with pytest.raises(CheckpointError, match="not JSON"):
        ck.last_planned()
