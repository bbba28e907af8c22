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
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from quire.protocol import (
    ApplyChange, ApplyRequest, ApplyResponse, Codec, FragmentSpec, Hello, HelloAck, JournalSpec,
    ListRequest, ListResponse, Status,
)
from quire.protocol.stream import FrameStream
from quire.services import EtcdService, free_port

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


async def _conn(endpoint: str, timeout: float = 30.0) -> FrameStream:
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = await FrameStream.connect(endpoint)
            await s.send(Hello())
            await s.read_message(HelloAck)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # the coordinator is starting


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
    s = await _conn(endpoint)
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
                    [sys.executable, "-m", "coordinator.main", "--zone", "z0", "--id", "node-0",
                     "--listen", endpoint, "--etcd", etcd.url, "--root", "/quire-bench-idle",
                     "--spool-dir", os.path.join(work, "spool"), "--log-level", "WARNING",
                     "--log-format", "json", "--journal-limit", str(max(steps) + 24)],
                    stdout=log, stderr=subprocess.STDOUT)
            result = asyncio.run(_run(endpoint, proc.pid, steps, args.settle))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    for st in result["steps"]:
        print(f"{st['journals']:>5} idle journals: RSS {st['rss_mb']} MB "
              f"(+{st['rss_over_1_journal_mb']} MB over 1 journal), {st['fds']} fds, "
              f"{st['threads']} threads, placed in {st['placed_s']} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
