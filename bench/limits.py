"""Physical limits measured in the same run as quire: SHA-1 and loopback TCP.

Same method as shared/reference/machine-limits.md (B1, B2), so the figures can be put
side by side with the anchors:

  * `sha1_mbps(chunk)`: one thread, `hashlib.sha1().update()` over a random buffer in
    pieces of `chunk` bytes (B1 used 64 KiB and 1 MiB; 256 MiB per measurement).
  * `loopback_mbps()`: two processes; the client writes a 1 MiB `bytes` and awaits
    `drain()` in a loop, the server loops on `StreamReader.read(1 MiB)` and measures from
    first byte to EOF (B2 "asyncio streams").
  * `loopback_rtt()`: 1 KiB request, 1 KiB echo; `inflight` requests outstanding (B2
    ping-pong); round trips per second and p50/p99 latency.

Every loop is bounded by a byte/op count and by time. Values are medians of `reps`.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing as mp
import os
import socket
import statistics
import time
from collections import deque
from typing import Any

from .latency import LatencyHistogram

__all__ = ["sha1_mbps", "loopback_mbps", "loopback_rtt", "measure_limits"]

MB = 1e6


def sha1_mbps(chunk: int = 1 << 20, *, max_bytes: int = 256 << 20, max_seconds: float = 1.0,
              reps: int = 3) -> float:
    buf = memoryview(os.urandom(chunk))
    results = []
    for _ in range(reps):
        h = hashlib.sha1()
        done = 0
        t0 = time.perf_counter()
        deadline = t0 + max_seconds
        while done < max_bytes:
            h.update(buf)
            done += chunk
            if (done // chunk) % 16 == 0 and time.perf_counter() >= deadline:
                break
        results.append(done / (time.perf_counter() - t0) / MB)
    return statistics.median(results)


# -- loopback TCP, server side runs in a child process -----------------------------------

def _sink_server(port_q: Any, result_q: Any, mode: str) -> None:
    from tools.lifetime import die_with_parent

    parent = mp.parent_process()
    die_with_parent(parent=parent.pid if parent is not None else None)  # never outlive the bench

    async def main() -> None:
        done = asyncio.Event()

        async def sink(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            n, first = 0, 0.0
            while data := await r.read(1 << 20):
                if not n:
                    first = time.perf_counter()
                n += len(data)
            result_q.put((n, time.perf_counter() - first if n else 0.0))
            w.close()
            done.set()

        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while True:
                    w.write(await r.readexactly(1024))
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            w.close()
            done.set()

        server = await asyncio.start_server(sink if mode == "sink" else echo, "127.0.0.1", 0,
                                            limit=1 << 21)
        port_q.put(server.sockets[0].getsockname()[1])
        await asyncio.wait_for(done.wait(), 120)
        server.close()

    asyncio.run(main())


class _Server:
    def __init__(self, mode: str) -> None:
        ctx = mp.get_context("spawn")
        self.port_q, self.result_q = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_sink_server, args=(self.port_q, self.result_q, mode),
                                daemon=True)

    def __enter__(self) -> _Server:
        self.proc.start()
        self.port = self.port_q.get(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


async def _blast(port: int, seconds: float, max_bytes: int) -> int:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    payload = os.urandom(1 << 20)
    sent = 0
    deadline = time.perf_counter() + seconds
    while sent < max_bytes and time.perf_counter() < deadline:
        w.write(payload)
        await w.drain()
        sent += len(payload)
    w.close()
    await w.wait_closed()
    return sent


def loopback_mbps(*, seconds: float = 2.0, max_bytes: int = 32 << 30, reps: int = 3) -> float:
    results = []
    for _ in range(reps):
        with _Server("sink") as srv:
            asyncio.run(_blast(srv.port, seconds, max_bytes))
            n, elapsed = srv.result_q.get(timeout=seconds + 30)
        results.append(n / elapsed / MB if elapsed else 0.0)
    return statistics.median(results)


async def _pingpong(port: int, inflight: int, seconds: float,
                    max_ops: int) -> tuple[int, float, LatencyHistogram]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = os.urandom(1024)
    sent_at: deque[float] = deque()  # the send times of the requests in flight
    lat = LatencyHistogram()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    for _ in range(inflight):
        sent_at.append(time.perf_counter())
        w.write(req)
    sent = inflight
    done = 0
    while True:
        await r.readexactly(1024)
        now = time.perf_counter()
        lat.record(now - sent_at.popleft())
        done += 1
        if now < deadline and sent < max_ops:
            sent_at.append(now)
            sent += 1
            w.write(req)
        elif done == sent:
            break
    elapsed = time.perf_counter() - t0
    w.close()
    return done, elapsed, lat


def loopback_rtt(inflight: int = 1, *, seconds: float = 2.0, max_ops: int = 2_000_000) -> dict[str, float]:
    with _Server("echo") as srv:
        done, elapsed, lat = asyncio.run(_pingpong(srv.port, inflight, seconds, max_ops))
    return {"ops_per_s": done / elapsed, "p50_us": lat.percentile_ns(0.5) / 1e3,
            "p99_us": lat.percentile_ns(0.99) / 1e3}


def measure_limits(quick: bool = False) -> dict[str, Any]:
    """Every limit the bench reports, keyed as in docs/benchmarks.md."""
    secs = 1.0 if quick else 2.0
    reps = 2 if quick else 3
    out: dict[str, Any] = {
        "sha1_64k_mbps": sha1_mbps(1 << 16, max_seconds=secs / 2, reps=reps),
        "sha1_1m_mbps": sha1_mbps(1 << 20, max_seconds=secs / 2, reps=reps),
        "sha1_1k_mbps": sha1_mbps(1 << 10, max_seconds=secs / 2, reps=reps),
        "loopback_tcp_mbps": loopback_mbps(seconds=secs, reps=reps),
    }
    for n in (1, 64):
        rtt = loopback_rtt(n, seconds=secs)
        out[f"loopback_rtt_1k_x{n}_ops"] = rtt["ops_per_s"]
        out[f"loopback_rtt_1k_x{n}_p50_us"] = rtt["p50_us"]
    return out


if __name__ == "__main__":  # pragma: no cover - manual check
    import json

    print(json.dumps(measure_limits(quick=True), indent=1))
