"""A Spark target (local mode) run by the scheduler: `spark.jobs.window_counts` reads one
window's offset ranges from the store and appends its counts once."""

from __future__ import annotations

import pytest

from tests.jobs.jobs_support import JOURNALS, OUTPUT, WINDOW, Cluster, Writer, wait_until
from tests.jobs.test_jobs_e2e import _succeeded

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def test_spark_target_counts_a_window_once(etcd, etcd_root, redis_db, tmp_path) -> None:
    cluster = Cluster(etcd=etcd, root=etcd_root, redis_url=redis_db.url, tmp=tmp_path)
    writer = None
    try:
        cluster.start_single()
        cluster.start_worker(concurrency=4, queues=("pulse",))
        cluster.start_worker(concurrency=4)
        cluster.start_beat()
        writer = Writer(cluster.endpoints, JOURNALS)
        writer.start()
        cluster.apply_job({"name": "spark", "selector": "topic=job-events",
                           "window": f"{WINDOW}s", "output": OUTPUT, "max_concurrent": 1,
                           "target": {"kind": "spark", "name": "window_counts"},
                           "args": {"field": "key"}, "retries": 2, "backoff": "1s",
                           "timeout": "10m"})
        ran = wait_until(lambda: _succeeded(cluster, "spark"), 600, "a Spark run to succeed")[0]
        writer.stop()
        writer = None
        rows = [x for x in cluster.output_rows(OUTPUT)
                if x["job"] == "spark" and x["window_start"] == ran.window_start]
        assert rows and all(x["key"].startswith("k") for x in rows), rows
        for journal, (begin, end) in (ran.ranges or {}).items():
            assert sum(x["messages"] for x in rows if x["journal"] == journal) == \
                cluster.lines_in(journal, begin, end)
        assert len({(x["journal"], x["key"]) for x in rows}) == len(rows)  # once
        cluster.cli("jobs", "delete", "spark")
    except BaseException:
        print(cluster.dump(60))
        raise
    finally:
        if writer is not None:
            writer.stop()
        cluster.close()
