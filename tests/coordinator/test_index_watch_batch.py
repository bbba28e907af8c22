"""Index updates cost a coordinator per batch, not per journal (#49).

With thousands of journals refreshed every minute, the watch used to copy the whole
hosted set and make one Redis round trip per update message; now it takes every
buffered update at once, looks at the hosted journals once a second and loads the
batch in one pipeline. Against a real Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec

from coordinator.index_watch import INDEX_CHANNEL, INDEX_KEY_PREFIX, IndexWatch
from protocol import Fragment

HOSTED = 2000
UPDATED = 400


async def test_a_burst_of_updates_is_loaded_in_batches(redis_db) -> None:  # noqa: ANN001
    names = [f"batch/j-{i:04d}" for i in range(HOSTED)]
    looks = 0

    def journals() -> list[str]:
        nonlocal looks
        looks += 1
        return names

    applied: dict[str, int] = {}

    def apply(journal: str, fragments) -> None:  # noqa: ANN001
        applied[journal] = fragments[0].end if fragments else 0

    watch = IndexWatch(redis_db.url, apply=apply, journals=journals)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.connected.wait(), 20)
        looks_before = looks
        r = redis_db.client
        pipe = r.pipeline(transaction=False)
        for i, name in enumerate(names[:UPDATED]):
            frag = Fragment(journal=name, begin=0, end=100 + i, sum="0" * 40)
            pipe.set(INDEX_KEY_PREFIX + name, msgspec.json.encode([frag]))
            pipe.publish(INDEX_CHANNEL, name)
        pipe.execute()
        deadline = time.monotonic() + 30
        while any(applied.get(n) != 100 + i for i, n in enumerate(names[:UPDATED])):
            assert time.monotonic() < deadline, "the updates were not all applied in 30 s"
            await asyncio.sleep(0.05)
        loads = sum(watch.applied.get(n, 0) for n in names[:UPDATED])
        # One look at the hosted journals per second, not one per update message.
        assert looks - looks_before < UPDATED // 4, looks
        assert loads >= UPDATED  # every update loaded (nothing was there at the first load)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_created_replicas_are_loaded_by_one_task_in_batches(redis_db) -> None:  # noqa: ANN001
    """Thousands of replicas created at once queue their first index load: one task
    loads them `batch` at a time (a task and a pipeline each, thousands at once, broke
    the Redis connection and a RuntimeError killed the coordinator)."""
    names = [f"queued/j-{i:04d}" for i in range(HOSTED)]
    loaded: list[str] = []
    watch = IndexWatch(redis_db.url, apply=lambda _j, _f: None, loaded=loaded.append,
                       journals=lambda: names, batch=200)
    starts = sum(watch.queue(n) for n in names)
    assert starts == 1  # one flusher for all of them
    await asyncio.wait_for(watch.flush_queued(), 30)
    assert sorted(loaded) == names
    assert watch.flushes == HOSTED // 200
    assert watch.queue(names[0])  # idle again: the next queue starts a flusher


async def test_a_failed_queued_load_is_only_logged(redis_db) -> None:  # noqa: ANN001
    watch = IndexWatch(redis_db.url, apply=lambda _j, _f: None, journals=lambda: [])

    async def broken(_names) -> int:  # noqa: ANN001 - what uvloop raises for a closed transport
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    watch.load = broken  # type: ignore[method-assign]
    assert watch.queue("queued/broken")
    await asyncio.wait_for(watch.flush_queued(), 10)  # returns: no exception escapes
    assert watch.queue("queued/broken")
