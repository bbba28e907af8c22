"""The peer: Redis Streams XADD on a private redis-server, driven from Python.

Same setup as shared/reference/machine-limits.md B4: `redis-server --save ""
--appendonly yes --appendfsync everysec --auto-aof-rewrite-percentage 0` (the last flag
keeps a background AOF rewrite from forking mid-run), a fresh data dir, `XADD bench * f
<payload>`, the stream deleted after each case. Clients are redis-py (no hiredis):

  * `xadd_sync`: one connection, one XADD at a time (latency p50/p99 per XADD);
  * `xadd_pipelined`: one connection, pipelines of up to 100 XADDs (fewer for big
    payloads: a pipeline holds at most 8 MiB);
  * `xadd_concurrent`: redis.asyncio with N tasks each doing one XADD at a time over a
    pool of N connections -- the same shape as quire's N concurrent appenders.

Every case is bounded by time and by bytes/count.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any

import redis
import redis.asyncio as aredis

from tools.services import Service, ServiceError, free_port

from .latency import LatencyHistogram

__all__ = ["BenchRedis", "xadd_sync", "xadd_pipelined", "xadd_concurrent", "measure_redis"]

MB = 1e6
STREAM = "bench"


class BenchRedis(Service):
    """A private redis-server with an append-only file (fsync every second)."""

    ready_timeout = 15.0

    def __init__(self, *, appendfsync: str = "everysec", **kwargs: Any) -> None:
        super().__init__("bench-redis", **kwargs)
        self.port = free_port()
        self.appendfsync = appendfsync

    def build_argv(self) -> list[str]:
        exe = shutil.which("redis-server")
        if exe is None:
            raise ServiceError("redis-server not found on PATH; install the Debian package redis-server")
        return [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--appendfsync", self.appendfsync,
                "--auto-aof-rewrite-percentage", "0", "--dir", str(self.workdir),
                "--daemonize", "no", "--logfile", ""]

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)

    def probe(self) -> bool:
        with self.client() as r:
            return bool(r.ping())

    def version(self) -> str:
        with self.client() as r:
            return str(r.info("server").get("redis_version", "?"))


def _result(n: int, size: int, elapsed: float,
            hist: LatencyHistogram | None = None) -> dict[str, float]:
    out = {"ops_per_s": n / elapsed, "mbps": n * size / elapsed / MB, "n": n}
    if hist is not None and hist.n:
        out.update(hist.summary())
    return out


def _limit(size: int, max_bytes: int, max_ops: int) -> int:
    return max(1, min(max_ops, max_bytes // size))


def xadd_sync(r: redis.Redis, size: int, *, seconds: float, max_bytes: int = 1 << 30,
              max_ops: int = 1_000_000) -> dict[str, float]:
    payload = b"x" * size
    limit = _limit(size, max_bytes, max_ops)
    hist = LatencyHistogram()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    n = 0
    while n < limit:
        s = time.perf_counter()
        r.xadd(STREAM, {"f": payload})
        e = time.perf_counter()
        hist.record(e - s)
        n += 1
        if e >= deadline:
            break
    out = _result(n, size, time.perf_counter() - t0, hist)
    r.delete(STREAM)
    return out


def xadd_pipelined(r: redis.Redis, size: int, *, seconds: float, depth: int = 100,
                   max_bytes: int = 1 << 30, max_ops: int = 5_000_000) -> dict[str, float]:
    payload = b"x" * size
    depth = max(1, min(depth, (8 << 20) // size))
    limit = _limit(size, max_bytes, max_ops)
    t0 = time.perf_counter()
    deadline = t0 + seconds
    n = 0
    hist = LatencyHistogram()  # one sample per pipeline: its first message's wait
    while n < limit and time.perf_counter() < deadline:
        s = time.perf_counter()
        pipe = r.pipeline(transaction=False)
        k = min(depth, limit - n)
        for _ in range(k):
            pipe.xadd(STREAM, {"f": payload})
        pipe.execute()
        hist.record(time.perf_counter() - s)
        n += k
    out = _result(n, size, time.perf_counter() - t0, hist)
    out["depth"] = depth
    r.delete(STREAM)
    return out


async def _concurrent(port: int, size: int, tasks: int, seconds: float, limit: int) -> dict[str, float]:
    pool = aredis.BlockingConnectionPool(host="127.0.0.1", port=port, max_connections=tasks,
                                         timeout=30)
    r = aredis.Redis(connection_pool=pool)
    payload = b"x" * size
    hist = LatencyHistogram()
    count = 0
    deadline = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal count
        while count < limit and time.perf_counter() < deadline:
            count += 1
            s = time.perf_counter()
            await r.xadd(STREAM, {"f": payload})
            hist.record(time.perf_counter() - s)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(tasks)))
    out = _result(hist.n, size, time.perf_counter() - t0, hist)
    await r.delete(STREAM)
    await r.aclose()
    await pool.aclose()
    return out


def xadd_concurrent(port: int, size: int, tasks: int, *, seconds: float,
                    max_bytes: int = 1 << 30, max_ops: int = 1_000_000) -> dict[str, float]:
    return asyncio.run(_concurrent(port, size, tasks, seconds, _limit(size, max_bytes, max_ops)))


def measure_redis(sizes: tuple[int, ...], concurrency: tuple[int, ...], *, seconds: float,
                  progress: Any = None) -> dict[str, Any]:
    """Every Redis figure, keyed `redis_<size>_<shape>_<metric>` (see docs/benchmarks.md)."""
    out: dict[str, Any] = {}
    with BenchRedis() as srv:
        out["redis_version"] = srv.version()
        with srv.client() as r:
            # Warm-up (AOF file creation, first-touch of memory), not measured.
            xadd_sync(r, 100, seconds=0.2, max_ops=5000)
            for size in sizes:
                name = _size_name(size)
                res = xadd_sync(r, size, seconds=seconds)
                out[f"redis_{name}_sync_ops"] = res["ops_per_s"]
                out[f"redis_{name}_sync_mbps"] = res["mbps"]
                out[f"redis_{name}_sync_p50_ms"] = res["p50_ms"]
                out[f"redis_{name}_sync_p99_ms"] = res["p99_ms"]
                res = xadd_pipelined(r, size, seconds=seconds)
                out[f"redis_{name}_pipe_ops"] = res["ops_per_s"]
                out[f"redis_{name}_pipe_mbps"] = res["mbps"]
                out[f"redis_{name}_pipe_p99_ms"] = res["p99_ms"]
                if progress:
                    progress(f"redis {name} sync/pipelined")
                for c in concurrency:
                    if c == 1:
                        continue  # the sync case is concurrency 1
                    res = xadd_concurrent(srv.port, size, c, seconds=seconds)
                    out[f"redis_{name}_c{c}_ops"] = res["ops_per_s"]
                    out[f"redis_{name}_c{c}_mbps"] = res["mbps"]
                    out[f"redis_{name}_c{c}_p50_ms"] = res["p50_ms"]
                    out[f"redis_{name}_c{c}_p99_ms"] = res["p99_ms"]
                    if progress:
                        progress(f"redis {name} x{c}")
    return out


def _size_name(size: int) -> str:
    if size % (1 << 20) == 0:
        return f"{size >> 20}m"
    if size % 1024 == 0:
        return f"{size >> 10}k"
    return f"{size}b"


size_name = _size_name


if __name__ == "__main__":  # pragma: no cover - manual check
    import json

    print(json.dumps(measure_redis((100, 1024, 65536), (1, 8, 64), seconds=1.0), indent=1))
