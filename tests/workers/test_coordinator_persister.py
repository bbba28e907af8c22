"""coordinator.persister + coordinator.index_watch against real Redis, workers and stores.

The replica side is a FragmentServer (a real socket serving FetchFragment) until the
coordinator runs these end to end (test_workers_e2e.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest

from coordinator.index_watch import IndexWatch
from coordinator.persister import CeleryPersister
from fragment_store import fragment_key
from tools.services import RedisService

from .fragment_server import FragmentServer, make_fragment
from .workers_support import put_journal, s3_url


@pytest.fixture
def own_redis():
    """A Redis of this test alone: the test stops and restarts it."""
    with RedisService("redis-own") as svc:
        yield svc


@pytest.fixture
def server():
    s = FragmentServer().start()
    yield s
    s.stop()


async def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(*runnables):
    tasks = [asyncio.create_task(r.run()) for r in runnables]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_closed_fragment_is_persisted_indexed_and_released(
        start_worker, etcd, etcd_root, s3_bucket, redis_db, server) -> None:
    j = "acme/e2e-persister"
    store = s3_url(s3_bucket)
    put_journal(etcd, etcd_root, j, stores=(store,), codec="zstd")
    data = os.urandom(100_000)
    f = make_fragment(j, 0, data, codec="zstd")
    server.add(f, data)
    applied: list[tuple[str, tuple]] = []

    persister = CeleryPersister(redis_db.url, endpoints=lambda _f: [server.endpoint],
                                store_for=lambda _j: store)

    def apply(journal, fragments):
        applied.append((journal, fragments))
        persister.mark_persisted(journal, fragments)

    watch = IndexWatch(redis_db.url, apply=apply, journals=lambda: [j])
    start_worker(queues=("persist", "index"))
    async with running(persister, watch):
        await asyncio.wait_for(watch.connected.wait(), 10)
        await persister.on_closed(f, "/spool/acme/0.spool")
        assert persister.lag()[j].bytes == len(data)
        await wait_until(lambda: not persister.pending(), 60, "the index to show the fragment persisted")
    assert s3_bucket.client.stat_object(s3_bucket.name, fragment_key(f)).size > 0
    journal, fragments = applied[-1]
    assert journal == j and [(x.begin, x.end, x.backing_store) for x in fragments] == [(0, len(data), store)]
    assert persister.stats.enqueued == 1 and persister.stats.enqueue_failures == 0
    assert watch.index_age()[j] < 60


async def test_redis_down_never_blocks_and_persistence_catches_up(
        start_worker, etcd, etcd_root, file_store, own_redis, server) -> None:
    j = "acme/redis-outage"
    put_journal(etcd, etcd_root, j, stores=(file_store,), codec="gzip")
    persister = CeleryPersister(own_redis.url, endpoints=lambda _f: [server.endpoint],
                                store_for=lambda _j: file_store, backoff_initial=0.2,
                                backoff_max=1.0, enqueue_timeout=3.0)
    persisted: set[tuple[int, int]] = set()

    def apply(journal, fragments):
        persisted.update((x.begin, x.end) for x in fragments)
        persister.mark_persisted(journal, fragments)

    watch = IndexWatch(own_redis.url, apply=apply, journals=lambda: [j], backoff_max=0.5)
    frags = []
    for i in range(3):
        data = os.urandom(20_000)
        f = make_fragment(j, i * 20_000, data, codec="gzip")
        server.add(f, data)
        frags.append(f)

    async with running(persister, watch):
        await asyncio.wait_for(watch.connected.wait(), 10)
        own_redis.stop()

        # Rolls keep happening while Redis is away; the hot path never waits on it.
        for f in frags:
            t0 = time.monotonic()
            await persister.on_closed(f, "")
            assert time.monotonic() - t0 < 0.01
            await asyncio.sleep(0.3)
        await wait_until(lambda: persister.stats.enqueue_failures >= 2, 20, "failed sends")
        assert not persister.broker_available
        lag = persister.lag()[j]
        assert lag.fragments == 3 and lag.bytes == 60_000 and lag.seconds > 0.5
        assert not watch.connected.is_set()

        own_redis.start()  # same port; empty, like a Redis restart without persistence
        worker = start_worker(queues=("persist", "index"), redis_url=own_redis.url)
        await wait_until(lambda: not persister.pending(), 60, "persistence to catch up")
        assert persister.broker_available
        assert persisted == {(f.begin, f.end) for f in frags}
        assert watch.connected.is_set() and watch.reconnects >= 1
        worker.stop()
