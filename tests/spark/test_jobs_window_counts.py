"""The Spark job target, short form (in `make test`): `spark.jobs.window_counts.run` on the
session's Spark (local mode) and stream cluster counts one window of one journal, read
from the store, and writes its counts through the quire sink under the run's
`idempotency_key`; run again with the same context (a retried attempt) it lands nothing
new. Two small Spark jobs on the session's JVM (no JVM of its own).

The long form — the scheduler starting the target as its own Spark application, a JVM
per attempt — is tests/jobs/test_jobs_spark.py (QUIRE_TEST_LONG=1)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest

from quire.client import SyncClient
from spark.jobs.window_counts import run
from tests.spark.stream_helpers import make_journals, persisted_end, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def test_spark_target_counts_a_window_and_writes_it_once(quire_spark: Any,
                                                         stream_cluster: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    journal, output = f"jobs-spark/{tag}/events", f"jobs-spark/{tag}/counts"
    store = stream_cluster.store_url
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, store, [journal, output])
        for n in range(0, 480, 4):  # ~12 KB: fragments of 2 KiB roll and are persisted
            client.append(journal, b"".join(
                json.dumps({"key": f"k{i % 3}", "n": i}).encode() + b"\n"
                for i in range(n, n + 4)))
        wait_for(lambda: persisted_end(store, journal) >= 4096, 120, "persistence")
        end = persisted_end(store, journal)  # the window: [0, end), whole fragments
        window = client.read_all(journal, 0)[:end]
        want = Counter(json.loads(line)["key"] for line in window.splitlines() if line)
        ctx = {"job": f"short-{tag}", "window_start": 1000, "window_end": 1010,
               "ranges": {journal: [0, end]}, "stores": {journal: store}, "output": output,
               "brokers": stream_cluster.endpoints, "args": {"field": "key"}, "rerun": 0,
               "attempt": 1, "idempotency_key": f"job/short-{tag}/1000"}

        def rows() -> list[dict[str, Any]]:
            data = client.read_all(output, 0)
            return [json.loads(line) for line in data.splitlines() if line.strip()]

        result = run(quire_spark, ctx)
        first = rows()
        assert result == {"rows": len(want), "messages": sum(want.values()),
                          "idempotency_key": ctx["idempotency_key"]}
        assert {x["key"]: x["messages"] for x in first} == dict(want)
        assert all(x["journal"] == journal and x["window_start"] == 1000
                   and x["window_end"] == 1010 and x["rerun"] == 0 for x in first), first
        assert len(first) == len(want)

        # A retried attempt: same context, same key — answered, nothing written twice.
        assert run(quire_spark, {**ctx, "attempt": 2}) == result
        assert rows() == first
