"""The replica's ownership tokens: the pipeline's send-side lock, which the whole-append
lane can take without awaiting, and a bounded acquire for the spool and pipeline locks
(split from replica.py, which re-exports both)."""

from __future__ import annotations

import asyncio


async def acquire_within(lock: asyncio.Lock, timeout: float) -> bool:
    """lock.acquire() bounded by `timeout`; no task or timer when the lock is free."""
    if not lock.locked() and not getattr(lock, "_waiters", None):
        return await lock.acquire()  # free and nobody queued: returns without waiting
    try:
        async with asyncio.timeout(timeout):
            return await lock.acquire()
    except TimeoutError:
        return False


class PipelineLock(asyncio.Lock):
    """The pipeline's send-side lock, which the whole-append lane can also take without
    awaiting (append_lane.py: a group commit holds it from its first append to the end
    of the loop turn)."""

    def free(self) -> bool:
        """Unlocked and nobody waits for it: an awaited acquire() would return at once."""
        return not self._locked and not self._waiters  # (asyncio.Lock's own state)

    def try_acquire(self) -> bool:
        """Take the lock now if it is free(); else False, and nothing changes."""
        if not self.free():
            return False
        self._locked = True
        return True

