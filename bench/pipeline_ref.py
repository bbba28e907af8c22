"""The reference quire's append path is measured against: a minimal R=3 pipeline.

Three processes on loopback (the shape of a 3-coordinator cluster), each on uvloop like
the coordinators. A client connection names a journal; the process it reaches is that
journal's primary. For each append the primary writes the bytes to a spool file and
folds them into a running SHA-1 (as the spool does), streams them to the journal's two
replicas over persistent sockets (one per replica and journal), and acknowledges the
client once **both** replicas have written, hashed and acknowledged — in order, with
appends pipelined. No etcd, no FSM, no registers, no flow control, no metrics: what is
left is the work a replicated append cannot avoid in Python, so
`quire / reference` is the share of that floor quire reaches.

    python -m bench.pipeline_ref [--seconds 2]       # its own figures, for a look

Wire (all little-endian): client → primary: `u32 journal` once, then per append
`u32 len | bytes`; primary → client: `u64 end offset` per append. Primary → replica:
`u32 journal` once, then `u32 len | bytes`; replica → primary: one byte per append.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing as mp
import os
import struct
import tempfile
import time
from collections import deque
from typing import Any

from .latency import LatencyHistogram

__all__ = ["PipelineRef", "ref_case"]

MB = 1e6
LIMIT = 1 << 21
"""StreamReader buffer limit, as quire's FrameStream (a 1 MiB append in few reads)."""
WRAP = 256 << 20
"""Spool files are written modulo this size, so a long run does not fill the disk."""
FRESH = 1 << 30
"""Journal ids with this bit write on without wrapping (`ref_case(fresh=True)`): every
append fills new page-cache pages, as quire's spools do in the bench, where no persister
runs to hand their files back for reuse (docs/benchmarks.md, "The 64 KiB figures")."""

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class _Spool:
    """An append-only file plus its running SHA-1 (the spool's per-append work)."""

    def __init__(self, path: str, wrap: int = WRAP) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.sha = hashlib.sha1()
        self.end = 0
        self.wrap = wrap

    def write(self, data: bytes | memoryview) -> int:
        os.pwrite(self.fd, data, self.end % self.wrap)
        self.sha.update(data)
        self.end += len(data)
        return self.end


class _Pipeline:
    """One journal's primary: spool, two replica sockets, acks in order."""

    def __init__(self, spool: _Spool, writers: list[asyncio.StreamWriter],
                 readers: list[asyncio.StreamReader]) -> None:
        self.spool = spool
        self.writers = writers
        self.pending: deque[tuple[asyncio.Future[int], int]] = deque()
        self.acked = [0] * len(writers)
        self.done = 0
        self.sent = 0
        for i, r in enumerate(readers):
            asyncio.get_running_loop().create_task(self._acks(i, r))

    def append(self, data: bytes) -> asyncio.Future[int]:
        end = self.spool.write(data)
        head = _U32.pack(len(data))
        for w in self.writers:
            w.write(head)
            w.write(data)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.pending.append((fut, end))
        self.sent += 1
        return fut

    async def _acks(self, i: int, r: asyncio.StreamReader) -> None:
        while True:
            got = await r.read(65536)
            if not got:
                return
            self.acked[i] += len(got)
            upto = min(self.acked)
            while self.done < upto:
                fut, end = self.pending.popleft()
                self.done += 1
                if not fut.done():
                    fut.set_result(end)


def _wrap(journal: int) -> int:
    return 1 << 62 if journal & FRESH else WRAP


def _serve(index: int, ports: list[int], workdir: str, ready: Any) -> None:
    """One process of the reference: primary for the journals its clients name,
    replica for the journals the other two lead."""
    from tools.lifetime import die_with_parent

    parent = mp.parent_process()
    die_with_parent(parent=parent.pid if parent is not None else None)  # never outlive the bench

    async def main() -> None:
        pipelines: dict[int, _Pipeline] = {}
        building: dict[int, asyncio.Lock] = {}
        peers = [p for i, p in enumerate(ports[1::2]) if i != index]

        async def pipeline(journal: int) -> _Pipeline:
            async with building.setdefault(journal, asyncio.Lock()):
                if journal not in pipelines:
                    spool = _Spool(os.path.join(workdir, f"p{index}-j{journal}"), _wrap(journal))
                    conns = [await asyncio.open_connection("127.0.0.1", p, limit=LIMIT)
                             for p in peers]
                    for _, w in conns:
                        w.write(_U32.pack(journal))
                    pipelines[journal] = _Pipeline(spool, [w for _, w in conns],
                                                   [r for r, _ in conns])
            return pipelines[journal]

        async def client(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                (journal,) = _U32.unpack(await r.readexactly(4))
                p = await pipeline(journal)
                while True:
                    (n,) = _U32.unpack(await r.readexactly(4))
                    end = await p.append(await r.readexactly(n))
                    w.write(_U64.pack(end))
            except (asyncio.IncompleteReadError, ConnectionError):
                w.close()

        async def replica(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                (journal,) = _U32.unpack(await r.readexactly(4))
                spool = _Spool(os.path.join(workdir, f"r{index}-j{journal}-{id(w)}"),
                               _wrap(journal))
                while True:
                    (n,) = _U32.unpack(await r.readexactly(4))
                    spool.write(await r.readexactly(n))
                    w.write(b"\x01")
            except (asyncio.IncompleteReadError, ConnectionError):
                w.close()

        await asyncio.start_server(client, "127.0.0.1", ports[2 * index], limit=LIMIT)
        await asyncio.start_server(replica, "127.0.0.1", ports[2 * index + 1], limit=LIMIT)
        ready.put(index)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(main())


class PipelineRef:
    """The three reference processes, started and stopped as a context manager."""

    def __init__(self) -> None:
        from tools.services import free_port

        self.ports = [free_port() for _ in range(6)]
        self._dir = tempfile.TemporaryDirectory(prefix="quire-pipeline-ref-")
        self._procs: list[Any] = []

    def endpoint(self, journal: int) -> int:
        """The client port of `journal`'s primary (journals are spread round-robin)."""
        return self.ports[2 * (journal % 3)]

    def __enter__(self) -> PipelineRef:
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        for i in range(3):
            p = ctx.Process(target=_serve, args=(i, self.ports, self._dir.name, ready),
                            daemon=True)
            p.start()
            self._procs.append(p)
        for _ in range(3):
            ready.get(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.join(10)
        self._dir.cleanup()


async def ref_case(ref: PipelineRef, size: int, concurrency: int, *, seconds: float,
                   journals: int = 1, max_bytes: int = 2 << 30,
                   max_ops: int = 1_000_000, fresh: bool = False) -> dict[str, Any]:
    """`concurrency` connections (spread over `journals`), each with one append of `size`
    bytes in flight, for `seconds`: the same shape and bounds as bench.matrix.append_case.
    `fresh`: spool files that never wrap (FRESH)."""
    payload = bytes(size)
    frame = _U32.pack(size) + payload
    limit = max(concurrency, min(max_ops, max_bytes // size))
    hist = LatencyHistogram()
    record = hist.record
    started = 0
    conns = []
    for i in range(concurrency):
        journal = (i % journals) | (FRESH if fresh else 0)
        r, w = await asyncio.open_connection("127.0.0.1", ref.endpoint(journal), limit=LIMIT)
        w.write(_U32.pack(journal))
        conns.append((r, w))
    deadline = time.perf_counter() + seconds

    async def one(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal started
        while started < limit and time.perf_counter() < deadline:
            started += 1
            s = time.perf_counter()
            w.write(frame)
            await r.readexactly(8)
            record(time.perf_counter() - s)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(r, w) for r, w in conns))
    finally:
        elapsed = time.perf_counter() - t0
        for _, w in conns:
            w.close()
    n = hist.n
    return {"ops_per_s": n / elapsed, "mbps": n * size / elapsed / MB, "n": n, **hist.summary()}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.pipeline_ref")
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args(argv)

    async def run() -> None:
        for size, conc, journals in ((1 << 10, 64, 1), (64 << 10, 8, 1), (1 << 20, 8, 1),
                                     (1 << 10, 1, 1), (1 << 10, 64, 8)):
            res = await ref_case(ref, size, conc, seconds=args.seconds, journals=journals)
            print(f"reference R=3 {size >> 10} KiB x{conc} over {journals} journal(s): "
                  f"{res['ops_per_s']:,.0f} appends/s, {res['mbps']:,.1f} MB/s, "
                  f"p99 {res['p99_ms']:.2f} ms")

    with PipelineRef() as ref:
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
