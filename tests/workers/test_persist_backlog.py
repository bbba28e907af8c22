"""Persistence you can see (issue 51): the backlog of acknowledged bytes not yet in the
store, and a refused persist with its reason, in Redis, metrics and `journals list --stats`.

A real coordinator (with Redis), real Celery workers, a file store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from fragment_store.persist_status import BACKLOG_KEY, FAILURES_KEY, read_backlog, read_failures
from protocol import FragmentSpec, JournalSpec
from quire.client.client import Client
from tools.services import free_port

from tests.coordinator.cluster import until

from .workers_support import REPO, appendable, coordinator, scrape


def _stats(port: int, redis_url: str) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "QUIRE_REDIS_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "tools.cli.main", "--broker", f"127.0.0.1:{port}",
                          "journals", "list", "--stats", "-o", "json"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    return {r["journal"]: r for r in map(json.loads, out.stdout.splitlines())}


async def test_backlog_grows_without_workers_and_drains_when_one_starts(
        start_worker, redis_db, etcd, etcd_root, tmp_path) -> None:
    j = "acme/backlog/part-000"
    store = (tmp_path / "store").as_uri() + "/"
    port, metrics_port = free_port(), free_port()
    coord = coordinator("coord-backlog", etcd=etcd, root=etcd_root, redis_url=redis_db.url,
                        spool_dir=str(tmp_path / "spool"), port=port, metrics_port=metrics_port)
    coord.start()
    qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
    try:
        await qc.apply([JournalSpec(name=j, replication=1, fragment=FragmentSpec(
            length=1024, compression_codec="none", stores=(store,), refresh_interval=1.0))])
        await until(lambda: appendable(qc, j), 30, "the journal to accept appends")
        # One coordinator cannot give a replication-2 journal its full route: its primary
        # says how many replicas are missing (the QuireRouteIncomplete alert's input).
        short = "acme/backlog/short"
        await qc.apply([JournalSpec(name=short, replication=2, fragment=FragmentSpec(
            stores=(store,)))])
        missing = await until(lambda: scrape(metrics_port, "quire_route_missing_replicas"), 30,
                              "the route gap to be reported")
        assert missing == {f'{{journal="{short}"}}': 1.0}
        await qc.append(j, b"a" * 3000)  # the open fragment holds it (over length)
        first = await until(lambda: read_backlog(redis_db.client).get(j), 20, "a backlog entry")
        assert first.bytes == 3000 and first.fragments == 0 and first.oldest > 0
        await qc.append(j, b"b" * 1500)  # rolls the 3000 (closed, pending), opens 1500

        def grown():
            b = read_backlog(redis_db.client).get(j)
            return b if b is not None and b.bytes == 4500 and b.updated > first.updated else None
        second = await until(grown, 20, "the backlog to count both appends")
        assert second.fragments == 1 and second.oldest == first.oldest  # the same oldest byte
        assert second.age() > first.age(first.updated)  # and it keeps ageing
        assert scrape(metrics_port, "quire_persist_backlog_bytes") == {f'{{journal="{j}"}}': 4500.0}
        [age] = scrape(metrics_port, "quire_persist_backlog_age_seconds").values()
        assert age > 0
        row = _stats(port, redis_db.url)[j]
        assert row["backlog_bytes"] == 4500 and row["backlog_age"] > 0 and not row["persist_error"]

        # A zero-byte append rolls the open 1500 (over length) too; a worker persists both.
        await qc.append(j, b"")
        start_worker(queues=("persist", "index"), QUIRE_STORE_URL=store)
        await until(lambda: not redis_db.client.hexists(BACKLOG_KEY, j), 60, "the backlog to drain")
        await until(lambda: not scrape(metrics_port, "quire_persist_backlog_bytes"), 20,
                    "the backlog metric to clear")
        row = _stats(port, redis_db.url)[j]
        assert row["backlog_bytes"] == 0 and row["fragments"] == 2
    finally:
        await qc.close()
        coord.close()


async def test_refused_persist_is_visible_with_its_reason(
        start_worker, redis_db, etcd, etcd_root, tmp_path) -> None:
    """Case 2 with auth off: the workers write only to their QUIRE_WORKER_STORES; a journal
    whose store is another one never persists, and says why."""
    j = "acme/refused/part-000"
    cluster_store = (tmp_path / "cluster").as_uri() + "/"
    elsewhere = (tmp_path / "elsewhere").as_uri() + "/"
    port, metrics_port = free_port(), free_port()
    coord = coordinator("coord-refused", etcd=etcd, root=etcd_root, redis_url=redis_db.url,
                        spool_dir=str(tmp_path / "spool"), port=port)
    coord.start()
    worker_metrics = free_port()
    start_worker(queues=("persist", "index"), QUIRE_STORE_URL=cluster_store,
                 QUIRE_WORKER_STORES=cluster_store,
                 QUIRE_WORKER_METRICS_PORT=str(worker_metrics))
    qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
    try:
        await qc.apply([JournalSpec(name=j, replication=1, fragment=FragmentSpec(
            length=1024, compression_codec="none", stores=(elsewhere,), refresh_interval=1.0))])
        await until(lambda: appendable(qc, j), 30, "the journal to accept appends")
        await qc.append(j, b"x" * 2000)
        await qc.append(j, b"")  # closes it: a persist task goes out and is refused
        failure = await until(lambda: read_failures(redis_db.client).get(j), 30,
                              "the refusal to be recorded")
        assert failure.reason == "store_not_allowed" and failure.store == elsewhere
        assert "StoreNotAllowed" in failure.message and elsewhere in failure.message
        refused = await until(lambda: scrape(worker_metrics, "quire_persist_failures_total"), 20,
                              "the failure counter")
        assert refused == {f'{{journal="{j}",reason="store_not_allowed"}}': 1.0}
        # The primary publishes its backlog every few seconds: wait for the report that
        # counts both fragments (the refusal alone can come first).
        def counted():
            b = read_backlog(redis_db.client).get(j)
            return b if b is not None and b.bytes == 2000 else None
        await until(counted, 30, "the backlog report to count the refused 2000 bytes")
        row = _stats(port, redis_db.url)[j]
        assert row["persist_error"].startswith("store_not_allowed: StoreNotAllowed")
        assert row["backlog_bytes"] == 2000 and redis_db.client.hexists(FAILURES_KEY, j)
    finally:
        await qc.close()
        coord.close()
