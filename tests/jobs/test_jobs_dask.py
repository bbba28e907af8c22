"""A Dask target run by the scheduler on real services (etcd, Redis, a coordinator, Celery
workers and beat, a file store): `spark.jobs.dask_targets:window_counts` reads each
window of three journals through the Dask reader and writes its counts through the Dask
writer under the run's `idempotency_key`.

Every first attempt fails *after* writing (`args.fail_attempts: 1`), so every window is
retried by the scheduler; the retry writes the same rows under the same key and is
answered with the first attempt's commit: one run per window, its rows in the output once.
"""

from __future__ import annotations

from collections import Counter

import pytest

from protocol.job import RunState
from tests.jobs.jobs_support import JOURNALS, OUTPUT, WINDOW, single_job_cluster, wait_until

pytestmark = pytest.mark.timeout(420)

TARGET = {"kind": "dask", "name": "spark.jobs.dask_targets:window_counts"}


def test_dask_target_writes_each_window_once_across_a_retry(etcd, etcd_root, redis_db,
                                                             tmp_path) -> None:
    with single_job_cluster(etcd, etcd_root, redis_db.url, tmp_path) as (cluster, writer):
        cluster.apply_job({"name": "dask", "selector": "topic=job-events",
                           "window": f"{WINDOW}s", "output": OUTPUT, "target": TARGET,
                           "args": {"field": "key", "fail_attempts": 1}, "retries": 3,
                           "backoff": "1s", "max_concurrent": 2, "timeout": "5m"})

        def succeeded() -> list:  # type: ignore[type-arg]
            return [r for r in cluster.runs("dask") if r.state == RunState.SUCCEEDED]

        # The first window can be empty (the journals and the writer started late in it):
        # wait for two windows with messages; every succeeded run is checked below.
        def two_with_messages() -> list:  # type: ignore[type-arg]
            runs = succeeded()
            return runs if sum(r.result["messages"] > 0 for r in runs) >= 2 else []

        runs = wait_until(two_with_messages, 330, "two windows of the Dask job with messages")
        cluster.cli("jobs", "delete", "dask")  # no new runs while the output is checked
        writer.stop()
        assert not writer.errors[:1], writer.errors[:3]

        rows = [x for x in cluster.output_rows(OUTPUT) if x.get("job") == "dask"]
        seen = Counter((x["window_start"], x["journal"], x["key"]) for x in rows)
        assert not {k: n for k, n in seen.items() if n > 1}, "rows written more than once"
        for run in runs:
            # One run for the window; its first attempt wrote and failed, the retry's
            # write was answered by the first attempt's commit.
            assert run.attempt == 2, run
            assert "fails after writing" in run.attempts[0].error, run.attempts
            assert run.result["idempotency_key"] == f"job/dask/{run.window_start}"
            mine = [x for x in rows if x["window_start"] == run.window_start]
            assert all(x["window_end"] == run.window_end and x["rerun"] == 0
                       and x["key"].startswith("k") for x in mine), mine
            assert sum(x["messages"] for x in mine) == run.result["messages"], \
                (run.window_start, run.result)
            assert set(run.ranges or {}) == set(JOURNALS)
            for journal, (begin, end) in (run.ranges or {}).items():
                assert sum(x["messages"] for x in mine if x["journal"] == journal) == \
                    cluster.lines_in(journal, begin, end), (run.window_start, journal)
