"""The two load shapes every system of the bench is driven in.

  * `closed_loop`: `concurrency` tasks, each with one operation in flight at a time
    (send, wait for the acknowledgement, send the next) — quire's appenders, a Kafka
    producer per task with `send_and_wait`, `js.publish` awaited, XADD + WAIT;
  * `windowed`: one producer that keeps up to `window` operations outstanding and
    counts them as they are acknowledged — the batched shape (AppendService, Kafka's
    linger batching, JetStream's async publish, a Redis pipeline).

Both are bounded by time and by operations, and report ops/s, MB/s, errors and latency
p50/p99 (ms, send to acknowledgement at the client, in bench/latency.py's fixed buckets:
memory does not grow with the run). The windowed shape times one operation in
`SAMPLE_EVERY` (a done-callback per operation would cost the batched systems more than
their own per-message work).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .latency import LatencyHistogram

__all__ = ["closed_loop", "windowed", "SAMPLE_EVERY"]

MB = 1e6
SAMPLE_EVERY = 16


async def closed_loop(op: Callable[[int], Awaitable[Any]], size: int, concurrency: int, *,
                      seconds: float, max_bytes: int = 2 << 30, max_ops: int = 1_000_000
                      ) -> dict[str, Any]:
    """`op(task)` is one acknowledged operation of `size` bytes."""
    limit = max(concurrency, min(max_ops, max_bytes // max(size, 1)))
    hist = LatencyHistogram()
    record = hist.record
    errors: list[str] = []
    started = 0
    deadline = time.perf_counter() + seconds

    async def one(task: int) -> None:
        nonlocal started
        while started < limit and time.perf_counter() < deadline and len(errors) < 10:
            started += 1
            s = time.perf_counter()
            try:
                await op(task)
            except Exception as exc:  # noqa: BLE001 - reported in the figures
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            record(time.perf_counter() - s)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - t0
    n = hist.n
    return {"ops_per_s": n / elapsed, "mbps": n * size / elapsed / MB, "n": n,
            **hist.summary(), "errors": len(errors), "first_error": errors[0] if errors else ""}


async def windowed(start: Callable[[], "asyncio.Future[Any]"], size: int, window: int, *,
                   seconds: float, max_ops: int = 5_000_000) -> dict[str, Any]:
    """`start()` begins one operation and returns its future; up to `window` outstanding."""
    pending: list[asyncio.Future[Any]] = []
    ok = errors = n = 0
    hist = LatencyHistogram()
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def settle(futures: list[asyncio.Future[Any]]) -> None:
        nonlocal ok, errors
        for f in futures:
            try:
                await f
                ok += 1
            except Exception:  # noqa: BLE001 - counted
                errors += 1

    while n < max_ops and time.perf_counter() < deadline:
        f = start()
        if n % SAMPLE_EVERY == 0:
            sample_latency(f, hist)
        pending.append(f)
        n += 1
        if len(pending) >= window:
            half, pending = pending[:window // 2], pending[window // 2:]
            await settle(half)
    async with asyncio.timeout(120):
        await settle(pending)
    elapsed = time.perf_counter() - t0
    return {"ops_per_s": ok / elapsed, "mbps": ok * size / elapsed / MB, "n": ok,
            **hist.summary(), "errors": errors}


def sample_latency(f: "asyncio.Future[Any]", hist: LatencyHistogram,
                   since: float | None = None) -> None:
    """Record `f`'s time from `since` (default: now) to its successful completion."""
    s = time.perf_counter() if since is None else since

    def done(fut: "asyncio.Future[Any]") -> None:
        if not fut.cancelled() and fut.exception() is None:
            hist.record(time.perf_counter() - s)

    f.add_done_callback(done)
