"""A replicated peer: Redis Streams with two replicas, `WAIT 2 0` after each XADD.

Today's single Redis acknowledges an XADD held by one process; the fair form against
quire R=3 is a primary with two replicas where the writer waits until both have the
entry (`WAIT 2 0`: two replicas, no timeout). The primary keeps the bench's AOF setup
(bench/peers.py: append-only, fsync every second); replicas replicate asynchronously,
which WAIT turns synchronous for the writer.

    shapes: XADD + WAIT sent together (one round trip) per task, each task on its own
            connection; batched: a pipeline of up to 100 XADDs and one WAIT.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tools.services import ServiceError

from .closed_loop import closed_loop
from .latency import LatencyHistogram
from .peers import STREAM, BenchRedis

__all__ = ["RedisReplicas", "RedisWaitDriver"]


class _Replica(BenchRedis):
    def __init__(self, primary_port: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = f"bench-redis-replica-{self.port}"
        self.primary_port = primary_port

    def build_argv(self) -> list[str]:
        return [*super().build_argv(), "--replicaof", "127.0.0.1", str(self.primary_port)]


class RedisReplicas:
    """A primary and `replicas` replicas on loopback."""

    def __init__(self, workdir: Path, replicas: int = 2) -> None:
        self.primary = BenchRedis(workdir=workdir / "redis-primary")
        self.replicas = [_Replica(self.primary.port, workdir=workdir / f"redis-replica-{i}")
                         for i in range(replicas)]

    def __enter__(self) -> RedisReplicas:
        try:
            self.primary.start()
            for r in self.replicas:
                r.start()
            self._wait_online(30.0)
        except BaseException:
            self.close()
            raise
        return self

    def _wait_online(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.primary.client() as r:
            while True:
                info = r.info("replication")
                online = sum(1 for k, v in info.items()
                             if k.startswith("slave") and isinstance(v, dict)
                             and v.get("state") == "online")
                if online >= len(self.replicas):
                    return
                if time.monotonic() > deadline:
                    raise ServiceError(f"redis replicas not online after {timeout:g} s: {info}")
                time.sleep(0.1)

    def close(self) -> None:
        for s in (*self.replicas, self.primary):
            s.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisWaitDriver:
    """XADD + WAIT on the primary; runs the bench's shapes."""

    def __init__(self, cluster: RedisReplicas) -> None:
        self.port = cluster.primary.port
        self.replicas = len(cluster.replicas)

    async def __aenter__(self) -> RedisWaitDriver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def one_in_flight(self, size: int, concurrency: int, seconds: float) -> dict[str, Any]:
        import redis.asyncio as aredis

        payload, replicas = bytes(size), self.replicas
        conns = [aredis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)
                 for _ in range(concurrency)]

        async def op(task: int) -> None:
            pipe = conns[task].pipeline(transaction=False)
            pipe.xadd(STREAM, {"f": payload})
            pipe.execute_command("WAIT", replicas, 0)
            _, acked = await pipe.execute()
            if acked < replicas:
                raise RuntimeError(f"WAIT: {acked} of {replicas} replicas")

        try:
            return await closed_loop(op, size, concurrency, seconds=seconds)
        finally:
            await conns[0].delete(STREAM)
            for c in conns:
                await c.aclose()

    async def batched(self, size: int, depth: int, seconds: float) -> dict[str, Any]:
        """Pipelines of `depth` XADDs and one WAIT, one pipeline at a time."""
        import redis.asyncio as aredis

        payload, replicas = bytes(size), self.replicas
        r = aredis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)
        n = 0
        hist = LatencyHistogram()  # one sample per pipeline: its first message's wait
        t0 = time.perf_counter()
        try:
            while time.perf_counter() - t0 < seconds and n < 5_000_000:
                s = time.perf_counter()
                pipe = r.pipeline(transaction=False)
                for _ in range(depth):
                    pipe.xadd(STREAM, {"f": payload})
                pipe.execute_command("WAIT", replicas, 0)
                await pipe.execute()
                hist.record(time.perf_counter() - s)
                n += depth
            elapsed = time.perf_counter() - t0
            await r.delete(STREAM)
        finally:
            await r.aclose()
        return {"ops_per_s": n / elapsed, "mbps": n * size / elapsed / 1e6, "n": n,
                **hist.summary(), "errors": 0}
