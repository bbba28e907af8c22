"""A Spark target (local mode) run by the scheduler: `spark.jobs.window_counts` reads one
window's offset ranges from the store and writes its counts through the quire sink with
the run's `idempotency_key`; run again under the same key (a retried attempt), it lands
nothing new.

Each attempt is a Spark application of its own (a JVM start: minutes on the shared,
loaded 2-core machine), so this runs when QUIRE_TEST_LONG=1. `make test` runs the short
form, tests/spark/test_jobs_window_counts.py: the same target on the test session's Spark,
one window of one journal, retried under its key (the wiring — kind, module name — is
checked in test_job_spec.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.jobs.jobs_support import OUTPUT, REPO, WINDOW, single_job_cluster, wait_until
from tests.jobs.test_jobs_e2e import _succeeded

pytestmark = [pytest.mark.spark, pytest.mark.long, pytest.mark.timeout(1500),
              pytest.mark.skipif(not os.environ.get("QUIRE_TEST_LONG"),
                                 reason="long test (Spark sessions under load): QUIRE_TEST_LONG=1")]


def test_spark_target_writes_a_window_once_through_the_sink(etcd, etcd_root, redis_db,
                                                             tmp_path) -> None:
    with single_job_cluster(etcd, etcd_root, redis_db.url, tmp_path) as (cluster, writer):
        cluster.apply_job({"name": "spark", "selector": "topic=job-events",
                           "window": f"{WINDOW}s", "output": OUTPUT, "max_concurrent": 1,
                           "target": {"kind": "spark", "name": "window_counts"},
                           "args": {"field": "key"}, "retries": 2, "backoff": "1s",
                           "timeout": "15m"})
        ran = wait_until(lambda: _succeeded(cluster, "spark"), 900, "a Spark run to succeed")[0]
        cluster.cli("jobs", "delete", "spark")  # no more runs: the rows below are this one's
        writer.stop()
        key = f"job/spark/{ran.window_start}"
        assert ran.result["idempotency_key"] == key, ran.result

        def rows() -> list[dict]:
            return [x for x in cluster.output_rows(OUTPUT)
                    if x.get("job") == "spark" and x["window_start"] == ran.window_start]

        first = rows()
        assert first and all(x["key"].startswith("k") for x in first), first
        assert sum(x["messages"] for x in first) == ran.result["messages"] > 0
        for journal, (begin, end) in (ran.ranges or {}).items():
            assert sum(x["messages"] for x in first if x["journal"] == journal) == \
                cluster.lines_in(journal, begin, end)
        assert len({(x["journal"], x["key"]) for x in first}) == len(first)

        # A retried attempt: the same run context (same key), a new Spark application.
        ctx = {"job": "spark", "window_start": ran.window_start, "window_end": ran.window_end,
               "ranges": {j: list(r) for j, r in (ran.ranges or {}).items()},
               "output": OUTPUT, "args": {"field": "key"}, "rerun": 0, "attempt": 2,
               "brokers": cluster.endpoints,
               "stores": {j: cluster.store for j in (ran.ranges or {})},
               "idempotency_key": key}
        again = subprocess.run([sys.executable, "-m", "spark.jobs.window_counts",
                                "--run", json.dumps(ctx)], cwd=REPO, capture_output=True,
                               text=True, timeout=900)
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads(again.stdout.strip().splitlines()[-1])["messages"] == \
            ran.result["messages"]
        assert rows() == first  # nothing landed twice
