"""What idle journals cost: RSS of one coordinator hosting 1, 100 and 1,000 of them.

    python -m bench.idle [--json OUT] [--steps 1,100,1000] [--settle 3]

etcd + one coordinator process (`python -m coordinator.main`, replication 1); journals
are applied in batches (an etcd transaction holds at most 128 operations) and placed by
the coordinator's own allocator. After each step we wait until every journal has a
primary (bounded), let the pulses settle, and read VmRSS, open fds and threads of the
coordinator from /proc. Nothing is appended: the journals are idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time

from bench.common import coordinator_argv, hello_when_up, stop_processes, write_json
from protocol import (
    ApplyChange, ApplyRequest, ApplyResponse, Codec, FragmentSpec, JournalSpec,
    ListRequest, ListResponse, Status,
)
from protocol.stream import FrameStream
from tools.lifetime import dying_with_us
from tools.services import EtcdService, free_port

BATCH = 100


def _proc_stats(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                out["rss_mb"] = round(int(value.split()[0]) / 1024, 1)
            elif key == "Threads":
                out["threads"] = int(value)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


async def _routed(s: FrameStream, names: set[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await s.send(ListRequest())
        listing, _ = await s.read_message(ListResponse)
        if names <= {e.spec.name for e in listing.journals if e.route.primary >= 0}:
            return True
        await asyncio.sleep(0.5)  # the allocator places them in batches
    return False


async def _run(endpoint: str, pid: int, steps: list[int], settle: float) -> dict:
    s = await hello_when_up(endpoint)
    await asyncio.sleep(settle)
    out: dict = {"benchmark": "idle_journals", "steps": []}
    baseline = _proc_stats(pid)
    out["no_journals"] = baseline
    names: list[str] = []
    for target in steps:
        new = [f"bench/idle/j-{i:05d}" for i in range(len(names), target)]
        for k in range(0, len(new), BATCH):
            specs = [JournalSpec(name=n, replication=1,
                                 fragment=FragmentSpec(compression_codec=Codec.NONE))
                     for n in new[k:k + BATCH]]
            await s.send(ApplyRequest(changes=tuple(ApplyChange(upsert=x, expect_mod_revision=-1)
                                                    for x in specs)))
            resp, _ = await s.read_message(ApplyResponse)
            if resp.status != Status.OK:
                raise RuntimeError(f"apply failed: {resp.status.name} {resp.message}")
        names += new
        t0 = time.monotonic()
        if not await _routed(s, set(names), timeout=60 + target * 0.2):
            raise RuntimeError(f"{target} journals were not placed in time")
        placed = time.monotonic() - t0
        await asyncio.sleep(settle)  # pulses and route advertisements finish
        stats = _proc_stats(pid)
        stats.update(journals=target, placed_s=round(placed, 1),
                     rss_over_baseline_mb=round(stats["rss_mb"] - baseline["rss_mb"], 1))
        out["steps"].append(stats)
    one = out["steps"][0]["rss_mb"]
    for st in out["steps"]:
        st["rss_over_1_journal_mb"] = round(st["rss_mb"] - one, 1)
    out["load_avg_1m"] = os.getloadavg()[0]
    await s.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.idle")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--steps", default="1,100,1000")
    ap.add_argument("--settle", type=float, default=3.0)
    args = ap.parse_args(argv)
    steps = [int(x) for x in args.steps.split(",")]
    work = tempfile.mkdtemp(prefix="quire-bench-idle-")
    proc: subprocess.Popen | None = None
    try:
        with EtcdService("bench-idle-etcd") as etcd:
            endpoint = f"127.0.0.1:{free_port()}"
            with open(os.path.join(work, "node.log"), "wb") as log:
                proc = subprocess.Popen(
                    dying_with_us(coordinator_argv(
                        zone="z0", suffix="node-0", listen=endpoint, etcd_url=etcd.url,
                        root="/quire-bench-idle", spool_dir=os.path.join(work, "spool"),
                        extra=("--journal-limit", str(max(steps) + 24)))),
                    stdout=log, stderr=subprocess.STDOUT)
            result = asyncio.run(_run(endpoint, proc.pid, steps, args.settle))
    finally:
        stop_processes([proc] if proc is not None else [])
        shutil.rmtree(work, ignore_errors=True)
    for st in result["steps"]:
        print(f"{st['journals']:>5} idle journals: RSS {st['rss_mb']} MB "
              f"(+{st['rss_over_1_journal_mb']} MB over 1 journal), {st['fds']} fds, "
              f"{st['threads']} threads, placed in {st['placed_s']} s")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
