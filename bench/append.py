"""R=3 append throughput through real coordinator processes on loopback.

    python -m bench.append [--seconds 5] [--json OUT]

Starts etcd and three coordinators (`python -m coordinator.main`), creates one journal
at replication 3 (codec none), and measures, against its primary:
  * 64 KiB appends, 16 connections each appending back to back  -> MB/s
  * 1 KiB appends, 64 connections each with one append in flight -> appends/s
Every process shares this machine's cores with the client.
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
    AppendChunk, AppendCommit, AppendRequest, AppendResponse, ApplyChange, ApplyRequest,
    ApplyResponse, Codec, FragmentSpec, Hello, HelloAck, JournalSpec, ListRequest, ListResponse, Status,
)
from quire.protocol.stream import FrameStream
from quire.services import EtcdService, free_port

JOURNAL = "bench/append"


async def _conn(endpoint: str) -> FrameStream:
    s = await FrameStream.connect(endpoint)
    await s.send(Hello())
    await s.read_message(HelloAck)
    return s


async def _append(s: FrameStream, data: bytes) -> AppendResponse:
    s.write(AppendRequest(journal=JOURNAL))
    s.write(AppendChunk(), data)
    s.write(AppendCommit())
    await s.drain()
    msg, _ = await s.read_message(AppendResponse)
    return msg


async def _load(endpoint: str, size: int, conns: int, seconds: float) -> tuple[int, float]:
    data = os.urandom(size)
    streams = [await _conn(endpoint) for _ in range(conns)]
    count = 0
    stop = time.monotonic() + seconds

    async def worker(s: FrameStream) -> None:
        nonlocal count
        while time.monotonic() < stop:
            r = await _append(s, data)
            if r.status != Status.OK:
                raise RuntimeError(f"append failed: {r.status.name} {r.message}")
            count += 1

    t0 = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for s in streams:
            tg.create_task(worker(s))
    elapsed = time.monotonic() - t0
    for s in streams:
        await s.close()
    return count, elapsed


async def _run(args: argparse.Namespace, endpoints: list[str]) -> dict:
    deadline = time.monotonic() + 30
    while True:
        try:
            s = await _conn(endpoints[0])
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # coordinators starting
    spec = JournalSpec(name=JOURNAL, replication=3,
                       fragment=FragmentSpec(length=1 << 28, compression_codec=Codec.NONE))
    await s.send(ApplyRequest(changes=(ApplyChange(upsert=spec, expect_mod_revision=-1),)))
    await s.read_message(ApplyResponse)
    while True:  # wait for the route to form and the pipeline to sync
        try:
            r = await _append(s, b"")
            if r.status == Status.OK:
                break
        except Exception:  # noqa: BLE001 - answered early and closed: not ready yet
            pass
        await s.close()
        await asyncio.sleep(0.1)
        s = await _conn(endpoints[0])
    await s.send(ListRequest())
    listing, _ = await s.read_message(ListResponse)
    await s.close()
    route = next(e.route for e in listing.journals if e.spec.name == JOURNAL)
    primary = endpoints[[f"node-{i}" for i in range(3)].index(route.members[route.primary].suffix)]
    await _load(primary, 64 << 10, 16, 1.0)  # warm up
    n, t = await _load(primary, 64 << 10, 16, args.seconds)
    big = {"append_bytes": 64 << 10, "connections": 16, "appends": n,
           "mb_s": round(n * (64 << 10) / t / 1e6, 1)}
    n, t = await _load(primary, 1024, 64, args.seconds)
    small = {"append_bytes": 1024, "in_flight": 64, "appends": n, "appends_s": round(n / t)}
    return {"benchmark": "append_r3", "large": big, "small": small}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.append")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="quire-bench-append-")
    procs: list[subprocess.Popen] = []
    try:
        with EtcdService("bench-etcd") as etcd:
            endpoints = []
            for i in range(3):
                port = free_port()
                endpoints.append(f"127.0.0.1:{port}")
                log = open(os.path.join(work, f"node-{i}.log"), "wb")
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "coordinator.main", "--zone", f"z{i % 2}", "--id", f"node-{i}",
                     "--listen", endpoints[-1], "--etcd", etcd.url, "--root", "/quire-bench",
                     "--spool-dir", os.path.join(work, f"spool-{i}"), "--log-level", "WARNING",
                     "--log-format", "json"], stdout=log, stderr=subprocess.STDOUT))
            result = asyncio.run(_run(args, endpoints))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"64 KiB appends, R=3, 16 connections: {result['large']['mb_s']} MB/s")
    print(f"1 KiB appends, R=3, 64 in flight:    {result['small']['appends_s']} appends/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
