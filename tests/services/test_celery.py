"""A task round trip through a real worker subprocess and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tools.services import CeleryWorkerService, RedisDb, celery_client, slug


@pytest.fixture(params=["threads", "prefork"])
def worker(redis_db: RedisDb, request: pytest.FixtureRequest) -> Iterator[CeleryWorkerService]:
    svc = CeleryWorkerService(
        slug("w"),
        redis_url=redis_db.url,
        queues=["health"],
        pool=request.param,
        concurrency=1,
        # Mingle waits a second for peers that do not exist here.
        extra_args=["--without-mingle", "--without-gossip"],
    )
    with svc:
        yield svc


def test_ping_round_trip(worker: CeleryWorkerService, redis_db: RedisDb) -> None:
    client = celery_client(redis_db.url)
    try:
        result = client.send_task("workers.health.ping", args=["hello"], queue="health")
        reply = result.get(timeout=30)
    finally:
        client.close()
    assert reply["pong"] is True
    assert reply["echo"] == "hello"
    assert reply["worker"] == worker.nodename
    # With prefork the task runs in a pool child of the worker, not the worker.
    if worker.pool == "threads":
        assert reply["pid"] == worker.pid
    # Task events are on: the worker said so at startup.
    assert "task events: ON" in worker.log_text()
