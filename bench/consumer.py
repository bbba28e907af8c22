"""`python -m bench.consumer`: one shard running the count example vs a decode-only reference.

    python -m bench.consumer [--messages 300000] [--json out.json]

One run starts a local cluster (etcd + 1 coordinator, file store), appends N 100-byte
JSON messages to one journal (replication 1: this measures the consumer, not
replication), then over that same journal measures:

- reference: read + line framing + JSON decode, no handler, no store (messages/s);
- count: one shard as primary running consumers.examples.counts (read → decode →
  handle → RocksDB store → commit: recovery-log append + write batch), with the
  default 1 s checkpoint interval, from fence to the final commit.

and prints both rates, their ratio, and the commits per second of the count run.
Goal (issue #16): ratio >= 0.5 and >= 100k messages/s per shard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import msgspec

from chaos.cluster import LocalCluster
from consumers.examples.counts import Counts
from consumers.runner import ShardRunner
from protocol import Codec, FragmentSpec, JournalSpec, ProcessId
from protocol.logs import configure_logging
from protocol.shard import ShardSource, ShardSpec
from quire.client import Client, LineFramer
from topology.etcd import connect

SOURCE = "bench/consumer-src"
KEYS = 1000


def payload(seq: int) -> bytes:
    line = b'{"key":"k%04d","seq":%d,"pad":"' % (seq % KEYS, seq)
    return line + b"x" * (100 - len(line) - 3) + b'"}\n'


async def fill(client: Client, n: int, batch: int = 5000) -> int:
    total = 0
    for start in range(0, n, batch):
        data = b"".join(payload(i) for i in range(start, min(n, start + batch)))
        total += len(data)
        await client.append(SOURCE, data)
    return total


async def reference(client: Client, end: int) -> tuple[int, float]:
    decode = msgspec.json.Decoder().decode
    framer = LineFramer()
    n = 0
    started = time.perf_counter()
    async with client.read(SOURCE, 0, end_offset=end) as reader:
        async for offset, data in reader:
            for _, line in framer.feed(offset, data):
                decode(line)
                n += 1
            if offset + len(data) >= end:
                break
    return n, time.perf_counter() - started


async def _stop_at(runner: ShardRunner, end: int, stop: asyncio.Event) -> None:
    """Stop the shard once it has read through `end` (checked every 2 ms: no handler hook,
    so the measured path is exactly the example's)."""
    while runner.offsets.get(SOURCE, 0) < end:
        await asyncio.sleep(0.002)
    stop.set()


async def count(client: Client, etcd_url: str, root: str, n: int, end: int,
                workdir: str, shard_id: str) -> dict[str, Any]:
    etcd = await connect(etcd_url)
    stop = asyncio.Event()
    spec = ShardSpec(id=shard_id, sources=(ShardSource(journal=SOURCE),),
                     recovery_log_prefix="bench/recovery", checkpoint_interval=1.0)
    runner = ShardRunner(client=client, etcd=etcd, root=root, me=ProcessId("bench", "bench"),
                         spec=spec, app=Counts(), data_dir=workdir, snapshot_interval=3600.0)
    try:
        started = time.perf_counter()
        watcher = asyncio.create_task(_stop_at(runner, end, stop))
        await runner.run_primary(f"bench.bench.{os.getpid()}.{time.time_ns()}", stop)
        elapsed = time.perf_counter() - started
        watcher.cancel()
    finally:
        await etcd.close()
    return {"messages": n, "seconds": elapsed, "transactions": runner.transactions}


async def run(n: int, rounds: int = 2) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="quire-bench-consumer-")
    cluster = LocalCluster(1, zones=("zone-a",), workdir=os.path.join(workdir, "cluster")).start()
    try:
        store = f"file://{workdir}/store/"
        os.makedirs(f"{workdir}/store")
        async with Client(cluster.endpoints) as client:
            frag = FragmentSpec(length=1 << 28, compression_codec=Codec.NONE, stores=(store,))
            await client.apply([JournalSpec(name=SOURCE, replication=1, fragment=frag)]
                               + [JournalSpec(name=f"bench/recovery/count-{i}", replication=1,
                                              fragment=frag) for i in range(rounds)])
            await client.append(SOURCE, b"", retry_timeout=30.0)
            size = await fill(client, n)
            head = await client.write_head(SOURCE)
            assert head == size, (head, size)
            # Interleaved, best of `rounds` each: the machine may be shared.
            ref_s, res = float("inf"), {"seconds": float("inf")}
            for i in range(rounds):
                ref_n, seconds = await reference(client, head)
                assert ref_n == n
                ref_s = min(ref_s, seconds)
                one = await count(client, cluster.etcd.url, cluster.root, n, head,  # type: ignore[union-attr]
                                  os.path.join(workdir, f"shard-{i}"), f"count-{i}")
                if one["seconds"] < res["seconds"]:
                    res = one
    finally:
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
    ref_rate = n / ref_s
    count_rate = n / res["seconds"]
    return {
        "messages": n, "message_bytes": 100,
        "reference_msgs_per_s": round(ref_rate), "count_msgs_per_s": round(count_rate),
        "ratio": round(count_rate / ref_rate, 3),
        "count_seconds": round(res["seconds"], 3),
        "commits": res["transactions"],
        "commits_per_s": round(res["transactions"] / res["seconds"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.consumer", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--rounds", type=int, default=2, help="Best of this many runs of each.")
    p.add_argument("--json", default="", help="Also write the results to this file.")
    args = p.parse_args(argv)
    configure_logging("console", "WARNING", stream=sys.stderr)
    out = asyncio.run(run(args.messages, args.rounds))
    print(f"messages:   {out['messages']} x 100 B JSON, one journal, one shard")
    print(f"reference:  {out['reference_msgs_per_s']:>10,} msg/s  (read + framing + JSON decode)")
    print(f"count:      {out['count_msgs_per_s']:>10,} msg/s  (read + decode + handle + RocksDB + "
          f"commit; {out['commits']} commits, {out['commits_per_s']}/s)")
    print(f"ratio:      {out['ratio']:.2f}x of the reference")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
