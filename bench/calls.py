"""Python-level calls per append on the client side, counted rather than timed.

    python -m bench.calls [--appends 20000] [--conc 64] [--size 1024] [--top 25] [--json OUT]

Starts etcd + three coordinators (chaos.cluster.LocalCluster) and the minimal R=3
pipeline (bench/pipeline_ref.py), warms both up, then counts with `sys.setprofile`
every call this process makes — Python functions (`call` events) and C functions and
builtins (`c_call`) — while `--conc` tasks, one append in flight each, make `--appends`
appends of `--size` bytes through `Client.append` to one R=3 journal; then the same with
the reference's client (`write` + `readexactly(8)` per append). Both are driven by the
same loop (its own calls are in both counts), and the event loop's calls (callbacks,
`send`, `recv_into`, `epoll`) count too, since each system's client pays them.

A count does not depend on the machine's load, so it compares versions of the client
where a timing on a shared 2-vCPU machine cannot; `--top` lists the most called
functions of each, `file:line(name)` as cProfile names them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from chaos.cluster import LocalCluster
from protocol import Codec, FragmentSpec, JournalSpec
from quire.client import Client

from .common import write_json
from .pipeline_ref import _U32, LIMIT, PipelineRef

__all__ = ["count_calls", "main"]

JOURNAL = "bench/calls"


class _Counter:
    """A profile hook counting calls by function; on only between start() and stop()."""

    def __init__(self) -> None:
        self.py: Counter[Any] = Counter()
        self.c: Counter[Any] = Counter()

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.py[frame.f_code] += 1
        elif event == "c_call":
            self.c[arg] += 1

    def start(self) -> None:
        sys.setprofile(self._hook)

    def stop(self) -> None:
        sys.setprofile(None)

    def top(self, n: int) -> list[tuple[str, int]]:
        named: Counter[str] = Counter()
        for code, k in self.py.items():
            named[f"{Path(code.co_filename).name}:{code.co_firstlineno}({code.co_qualname})"] += k
        for fn, k in self.c.items():
            owner = getattr(fn, "__self__", None)
            prefix = type(owner).__name__ + "." if owner is not None and not isinstance(
                owner, type(sys)) else ""
            named[f"<{prefix}{getattr(fn, '__name__', repr(fn))}>"] += k
        return named.most_common(n)


async def count_calls(op: Callable[[int], Awaitable[Any]], appends: int, conc: int,
                      top: int = 25) -> dict[str, Any]:
    """Run `appends` × `op(task)` from `conc` tasks under the counter."""
    counter = _Counter()
    left = appends

    async def one(task: int) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await op(task)

    counter.start()
    try:
        await asyncio.gather(*(one(i) for i in range(conc)))
    finally:
        counter.stop()
    py, c = sum(counter.py.values()), sum(counter.c.values())
    return {"appends": appends, "python_calls_per_append": round(py / appends, 1),
            "c_calls_per_append": round(c / appends, 1),
            "calls_per_append": round((py + c) / appends, 1),
            "top": [(name, round(k / appends, 2)) for name, k in counter.top(top)]}


async def _run(args: argparse.Namespace, cluster: LocalCluster, ref: PipelineRef) -> dict[str, Any]:
    payload = bytes(args.size)
    client = Client(cluster.endpoints, retry_timeout=30)
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        await client.apply([JournalSpec(name=JOURNAL, replication=3, fragment=FragmentSpec(
            compression_codec=Codec.NONE))])
        await client.append(JOURNAL, b"", retry_timeout=120)  # waits out the assignment
        print("journal routed; counting", file=sys.stderr, flush=True)

        async def quire_op(_task: int) -> None:
            await client.append(JOURNAL, payload)

        frame = _U32.pack(args.size) + payload  # the reference's framing
        for _ in range(args.conc):
            r, w = await asyncio.open_connection("127.0.0.1", ref.endpoint(0), limit=LIMIT)
            w.write(_U32.pack(0))  # journal 0
            conns.append((r, w))

        async def ref_op(task: int) -> None:
            r, w = conns[task]
            w.write(frame)
            await r.readexactly(8)

        out: dict[str, Any] = {"size": args.size, "concurrency": args.conc}
        for name, op in (("quire", quire_op), ("pipeline", ref_op)):
            await count_calls(op, min(2000, args.appends), args.conc)  # warm up, not reported
            out[name] = await count_calls(op, args.appends, args.conc, args.top)
        out["ratio_quire_vs_pipeline"] = round(
            out["quire"]["calls_per_append"] / out["pipeline"]["calls_per_append"], 2)
        return out
    finally:
        for _, w in conns:
            w.close()
        await client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.calls")
    ap.add_argument("--appends", type=int, default=20_000)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quire-bench-calls-") as work:
        with LocalCluster(3, workdir=Path(work) / "cluster") as cluster, PipelineRef() as ref:
            out = asyncio.run(_run(args, cluster, ref))
    for name in ("quire", "pipeline"):
        r = out[name]
        print(f"{name}: {r['calls_per_append']} calls per append ({r['python_calls_per_append']} "
              f"Python functions, {r['c_calls_per_append']} C), {r['appends']} appends x{args.conc}")
        for fn, k in r["top"]:
            print(f"    {k:8.2f}  {fn}")
    print(f"quire / pipeline: {out['ratio_quire_vs_pipeline']}x")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
