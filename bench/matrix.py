"""quire's own figures: append throughput/latency and AppendService message rate.

  * `append_case`: `concurrency` tasks, each doing one `Client.append` at a time to the
    same journal (the coordinator pipelines them) — or, given several journals, task i
    to journal i mod n —, payloads of `size` bytes; ops/s, MB/s and client-side latency
    p50/p99. Bounded by time and by bytes.
  * `message_rate`: 100-byte JSON lines through `AppendService` (which batches many
    small messages into few transactional appends); messages/s until every accepted
    message is acknowledged, and p50/p99 from `svc.append` to the acknowledgement of
    one message in bench.closed_loop.SAMPLE_EVERY.

Every case uses the cluster started by `bench.main` (loopback only).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from quire.client import AppendService, Client

from .closed_loop import SAMPLE_EVERY, closed_loop, sample_latency
from .latency import LatencyHistogram

__all__ = ["append_case", "message_rate", "json_message"]

MB = 1e6


async def append_case(client: Client, journal: str | list[str], size: int, concurrency: int, *,
                      seconds: float, max_bytes: int = 2 << 30, max_ops: int = 1_000_000
                      ) -> dict[str, Any]:
    payload = bytes(size)
    journals = [journal] if isinstance(journal, str) else journal

    async def append(task: int) -> None:
        await client.append(journals[task % len(journals)], payload)

    return await closed_loop(append, size, concurrency, seconds=seconds, max_bytes=max_bytes,
                             max_ops=max_ops)


def json_message(i: int, size: int = 100) -> bytes:
    """A JSON line of exactly `size` bytes (newline included)."""
    head = json.dumps({"id": i, "ts": 1700000000.0, "pad": ""}, separators=(",", ":"))
    pad = size - len(head) - 1
    return head.replace('"pad":""', '"pad":"' + "x" * max(0, pad) + '"').encode() + b"\n"


async def _failed_when_done(futures: list[asyncio.Future[Any]]) -> int:
    """Wait until every future is done and count the failed ones. AppendService resolves
    a journal's messages in order, batch by batch, so this waits about once per batch;
    gather() would add a task-side callback and a loop hand-off per message, bench
    overhead that is not the service's (redis-py's pipeline has none either)."""
    failed = 0
    for f in futures:
        if not f.done():
            await asyncio.wait((f,))
        failed += f.cancelled() or f.exception() is not None
    return failed


async def message_rate(client: Client, journal: str, *, seconds: float, size: int = 100,
                       max_messages: int = 5_000_000, window: int = 20_000) -> dict[str, Any]:
    svc = AppendService(client)
    msgs = [json_message(i, size) for i in range(256)]
    assert all(len(m) == size for m in msgs)
    pending: list[asyncio.Future[Any]] = []
    n = 0
    errors = 0
    hist = LatencyHistogram()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    try:
        while n < max_messages and time.perf_counter() < deadline:
            if n % SAMPLE_EVERY == 0:
                s = time.perf_counter()
                f = await svc.append(journal, msgs[n & 255])
                sample_latency(f, hist, since=s)
            else:
                f = await svc.append(journal, msgs[n & 255])
            pending.append(f)
            n += 1
            if len(pending) >= window:
                # Bound the futures we hold; wait for the oldest half.
                half, pending = pending[:window // 2], pending[window // 2:]
                errors += await _failed_when_done(half)
        async with asyncio.timeout(120):
            errors += await _failed_when_done(pending)
        elapsed = time.perf_counter() - t0
    finally:
        await svc.close(timeout=30)
    ok = n - errors
    return {"msgs_per_s": ok / elapsed, "mbps": ok * size / elapsed / MB, "n": ok,
            **hist.summary(), "errors": errors}
