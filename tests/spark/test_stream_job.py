"""The continuous minute-counts job (spark/jobs/minute_counts.py) against the stream
cluster: every event is counted once, per (minute, key), into the output journal."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from tests.spark.stream_helpers import make_journals

pytestmark = pytest.mark.spark


def test_minute_counts_job(quire_spark: Any, stream_cluster: Any, tmp_path: Path) -> None:
    from quire.client import SyncClient
    from spark.jobs.minute_counts import StreamParams, prepare, start

    journals = ["job/events/part-000", "job/events/part-001"]
    brokers = ",".join(stream_cluster.endpoints)
    want: collections.Counter[tuple[str, str]] = collections.Counter()
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, journals, topic="job-events")
        for i in range(240):
            minute = f"2026-01-01T00:{i % 7:02d}:00Z"
            msg = {"key": f"user-{i % 3}", "ts": minute.replace(":00Z", f":{i % 60:02d}Z")}
            client.append(journals[i % 2], json.dumps(msg).encode() + b"\n")
            want[(minute, msg["key"])] += 1
        params = prepare(StreamParams(brokers=brokers, out_journal="job/minute-counts",
                                      checkpoint=str(tmp_path / "ck"), selector="topic=job-events",
                                      max_bytes_per_trigger=2048, trigger_seconds=0.1))
        assert params.store == stream_cluster.store_url  # from the source journals' specs
        query = start(quire_spark, params)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        got: collections.Counter[tuple[str, str]] = collections.Counter()
        batches = set()
        for line in client.read_all("job/minute-counts").splitlines():
            row = json.loads(line)
            got[(row["minute"], row["key"])] += row["events"]
            batches.add(row["batch"])
    assert got == want
    assert len(batches) > 1  # several micro-batches went through
