"""Append flow control: a minimum client rate (pure policer) and an optional max rate.

Appends are never buffered, so a slow appender holds the journal's pipeline and every
append queued behind it waits (head-of-line blocking). The MinRatePolicer gives each
append an allowance of `rate * initial_credit` bytes-worth of time; every received byte
adds to it (banked up to `max_bank` seconds) and time drains it at `rate`. When it runs
out the append is aborted and rolled back. Expressed as a *deadline* for the next
chunk, the adapter needs no periodic timer: it reads with that timeout.
"""

from __future__ import annotations

import asyncio
import time

DEFAULT_MIN_RATE = 64 * 1024
INITIAL_CREDIT = 1.0
MAX_BANK = 10.0


class MinRatePolicer:
    __slots__ = ("rate", "_balance", "_cap", "_t")

    def __init__(self, rate: float = DEFAULT_MIN_RATE, now: float = 0.0,
                 initial_credit: float = INITIAL_CREDIT, max_bank: float = MAX_BANK) -> None:
        self.rate = float(rate)
        self._balance = self.rate * initial_credit
        self._cap = self.rate * max_bank
        self._t = now

    def _drain(self, now: float) -> None:
        self._balance -= (now - self._t) * self.rate
        self._t = now

    def on_bytes(self, n: int, now: float) -> None:
        self._drain(now)
        if self._balance > 0:
            self._balance = min(self._balance + n, self._cap)

    def pause(self, seconds: float) -> None:
        """Time the broker itself held the append back (max rate) is not drained."""
        self._t += seconds

    def deadline(self, now: float) -> float:
        """Monotonic time by which more bytes must arrive (<= now: too slow already)."""
        self._drain(now)
        return now + self._balance / self.rate if self.rate > 0 else float("inf")

    def too_slow(self, now: float) -> bool:
        return self.deadline(now) <= now


class RateLimiter:
    """A per-journal token bucket for `max_append_rate` (1 s burst).

    One per replica (Replica.limiter_for), shared by the journal's successive appends,
    so a journal's rate holds across appends, not just within one. `taken` counts every
    byte let through, for tests and debugging.
    """

    __slots__ = ("rate", "taken", "_tokens", "_t")

    def __init__(self, rate: float, now: float | None = None) -> None:
        self.rate = float(rate)
        self.taken = 0
        self._tokens = self.rate
        self._t = time.monotonic() if now is None else now

    def delay_for(self, n: int, now: float) -> float:
        """Take n bytes; return how long the caller must wait before sending them."""
        self._tokens = min(self.rate, self._tokens + (now - self._t) * self.rate)
        self._t = now
        self._tokens -= n
        self.taken += n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def acquire(self, n: int) -> float:
        """Seconds the chunk was delayed (0.0: sent at once)."""
        delay = self.delay_for(n, time.monotonic())
        if delay > 0:
            await asyncio.sleep(delay)  # the throttle itself: waiting is the point
        return delay
