"""Round-robin appends over N journals, every N in one cluster, alternated: the rate
and each process's CPU per append.

    python -m bench.round_robin [--journals 10 64 256] [--seconds 4] [--rounds 2]
                                [--cold] [--json OUT]

`bench.scale`'s append phase (1 KiB appends from 64 tasks, each taking the next journal
round-robin over all N), in one 3-coordinator cluster (chaos.cluster.LocalCluster, as
bench/cpu.py) for every N, alternated round by round, so that the ratio to N = 10 is
not the machine's drift between fresh clusters minutes apart. For each (round, N):
appends/s, its ratio to the first N of the same round, and the user + sys CPU µs per
append of each coordinator and of this process (the client), from /proc.

Every journal took one append of each of its members before (its spool files exist),
unless `--cold`: then each N > 10 of each round appends to journals never appended
before, so each journal's first append (its spool files at three members) is in the
measure, as it is in bench.scale's ten-second window over 10,000 journals.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos.cluster import LocalCluster
from protocol import Codec, FragmentSpec, JournalSpec
from quire.client import Client

from .common import write_json
from .cpu import _snapshot

__all__ = ["main", "round_robin"]

TASKS = 64
SIZE = 1024
APPLY_CHUNK = 100
"""Specs per Client.apply (etcd's default limit is 128 operations per transaction)."""


async def round_robin(client: Client, names: list[str], seconds: float) -> tuple[int, float]:
    """(appends, appends/s) of TASKS tasks, each taking the next of `names` in turn."""
    nxt = itertools.cycle(names).__next__
    data = b"x" * (SIZE - 1) + b"\n"
    count = 0
    stop = time.monotonic() + seconds

    async def task() -> None:
        nonlocal count
        while time.monotonic() < stop:
            await client.append(nxt(), data)
            count += 1

    t0 = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for _ in range(TASKS):
            tg.create_task(task())
    return count, count / (time.monotonic() - t0)


async def _run(args: argparse.Namespace, cluster: LocalCluster) -> dict[str, Any]:
    sizes: list[int] = args.journals
    base = sizes[0]
    total = max(sizes)
    if args.cold:
        total = base + args.rounds * sum(k for k in sizes[1:])
    names = [f"bench/rr-{i:05d}" for i in range(total)]
    client = Client(cluster.endpoints, retry_timeout=60)
    try:
        for k in range(0, total, APPLY_CHUNK):
            await client.apply([JournalSpec(name=j, replication=3, fragment=FragmentSpec(
                compression_codec=Codec.NONE)) for j in names[k:k + APPLY_CHUNK]])
        for j in names:
            await client.append(j, b"", retry_timeout=60)  # writable (no spool file yet)
        await client.list_journals()  # (primes the route cache, as bench.scale does)
        pids = {c.suffix: c.pid for c in cluster.coordinators if c.pid is not None}
        await round_robin(client, names[:base] if args.cold else names, 2.0)  # warm up
        fresh = base
        rounds: list[list[dict[str, Any]]] = []
        for r in range(args.rounds):
            row: list[dict[str, Any]] = []
            for n in sizes:
                use = names[:n]
                if args.cold and n != base:
                    use, fresh = names[fresh:fresh + n], fresh + n
                before = _snapshot(pids)
                count, rate = await round_robin(client, use, args.seconds)
                after = _snapshot(pids)
                per = max(count, 1)
                cpu = {k: round((sum(after[k]) - sum(before[k])) / per * 1e6, 1) for k in after}
                fig = {"journals": n, "appends": count, "appends_per_s": round(rate, 1),
                       "ratio": round(rate / row[0]["appends_per_s"], 3) if row else 1.0,
                       "cpu_us_per_append": cpu, "cpu_us_total": round(sum(cpu.values()), 1),
                       "load_avg_1m": os.getloadavg()[0]}
                row.append(fig)
                print(f"round {r + 1} N={n}: {rate:,.0f} appends/s (x{fig['ratio']:.2f}), "
                      f"CPU us/append {cpu} total {fig['cpu_us_total']}, "
                      f"load {fig['load_avg_1m']:.1f}", file=sys.stderr, flush=True)
            rounds.append(row)
        return {"journals": sizes, "seconds": args.seconds, "cold": args.cold,
                "tasks": TASKS, "size": SIZE, "rounds": rounds}
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.round_robin",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--journals", type=int, nargs="+", default=[10, 64, 256],
                    help="the first is the base of the ratios")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cold", action="store_true",
                    help="each N but the first appends to journals never appended before")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.journals) or args.rounds < 1:
        ap.error("every N and --rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="quire-bench-rr-") as work:
        with LocalCluster(3, workdir=Path(work) / "cluster") as cluster:
            result = asyncio.run(_run(args, cluster))
    write_json(args.json, result)
    for row in result["rounds"]:
        print("  ".join(f"N={f['journals']}: {f['appends_per_s']:,.0f}/s x{f['ratio']:.2f} "
                        f"{f['cpu_us_total']:.0f} us" for f in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
