"""quire_index_age_seconds stays truthful for a journal whose refreshes publish nothing.

Index workers publish a journal's index only when it changed (#49); an unchanged
journal's refresh only advances its stamp in `quire:index-refreshed`. The watch reads
those stamps every `age_look` seconds, so the age of an idle journal's index stays
small instead of growing until stale-index alerts fire. Against a real Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec

from coordinator.index_watch import INDEX_CHANNEL, INDEX_KEY_PREFIX, REFRESHED_KEY, IndexWatch
from protocol import Fragment

AGE_LOOK = 0.2
WAIT = 20.0
"""Bound of every wait below (seconds)."""


async def wait_until(cond, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, f"{what} not within {WAIT} s"
        await asyncio.sleep(0.05)


async def test_an_unchanged_journal_keeps_a_small_index_age(redis_db) -> None:  # noqa: ANN001
    idle, other = "age/idle", "age/not-hosted"
    r = redis_db.client
    old = time.time() - 500  # the index was published 500 s ago, never changed since
    frag = Fragment(journal=idle, begin=0, end=10, sum="0" * 40)
    r.set(INDEX_KEY_PREFIX + idle, msgspec.json.encode([frag]))
    r.hset(REFRESHED_KEY, mapping={idle: f"{old:.3f}", other: f"{old:.3f}"})
    applied: list[str] = []
    watch = IndexWatch(redis_db.url, apply=lambda j, _f: applied.append(j),
                       journals=lambda: [idle], age_look=AGE_LOOK)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.connected.wait(), WAIT)
        assert applied == [idle]
        assert watch.index_age()[idle] >= 499
        # Refreshes of the unchanged journal: the stamp advances, nothing is published.
        for _ in range(3):
            now = time.time()
            r.hset(REFRESHED_KEY, mapping={idle: f"{now:.3f}", other: f"{now:.3f}"})
            await wait_until(lambda: watch.refreshed_at.get(idle) == float(f"{now:.3f}"),
                             "the new refresh stamp read")
            assert watch.index_age()[idle] < WAIT
        assert applied == [idle]  # the index itself was not fetched nor applied again
        assert other not in watch.refreshed_at  # only hosted journals are read
        # A stamp never goes back (a refresh finishing late).
        r.hset(REFRESHED_KEY, idle, f"{old:.3f}")
        stamp = watch.refreshed_at[idle]
        await asyncio.sleep(4 * AGE_LOOK)
        assert watch.refreshed_at[idle] == stamp
        # A changed index is still published and loaded at once.
        r.set(INDEX_KEY_PREFIX + idle, msgspec.json.encode([frag, Fragment(
            journal=idle, begin=10, end=20, sum="1" * 40)]))
        r.publish(INDEX_CHANNEL, idle)
        await wait_until(lambda: len(applied) == 2, "the published change applied")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
