"""The demo's consumer step: the count example over the demo's `events` topic.

1. apply a shard spec `demo-counts` (source: selector `topic=events`, every partition;
   output label -> `demo/counts/totals`) and create its recovery log and output journal;
2. start one consumer member (`python -m consumers.main run consumers.examples.counts:Counts`);
3. wait (bounded) until the published totals account for every message, show the
   `quire shards list` view and the top keys, then stop the member (SIGTERM: it commits
   and releases the shard).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from protocol import Codec, FragmentSpec, JournalSpec, LabelSet
from protocol.shard import ShardSource, ShardSpec
from quire.client import Client
from topology.etcd import connect
from tools.lifetime import dying_with_us
from tools.output import make_console, make_table
from topology.shards import ShardChange, apply_shards, list_statuses

console = make_console()
WAIT = 60.0
OUTPUT = "demo/counts/totals"


async def _totals(client: Client) -> dict[str, int]:
    head = await client.write_head(OUTPUT)
    totals: dict[str, int] = {}
    if head:
        async for _, data in client.read(OUTPUT, 0, end_offset=head):
            for line in data.splitlines():
                row = json.loads(line)
                totals[row["key"]] = row["count"]
    return totals


async def _run(endpoints: list[str], etcd_url: str, root: str, store: str, expected: int,
               data_dir: Path) -> int:
    fragment = FragmentSpec(length=1 << 20, compression_codec=Codec.GZIP, stores=(store,),
                            refresh_interval=1.0)
    etcd = await connect(etcd_url)
    member = None
    try:
        async with Client(endpoints, retry_timeout=30) as client:
            await client.apply([JournalSpec(name=n, replication=2, fragment=fragment)
                                for n in ("demo/recovery/demo-counts", OUTPUT)])
            spec = ShardSpec(id="demo-counts", sources=(ShardSource(selector="topic=events"),),
                             recovery_log_prefix="demo/recovery", checkpoint_interval=0.5,
                             labels=LabelSet.of(output=OUTPUT))
            await apply_shards(etcd, root, [ShardChange(spec=spec)])
            argv = [sys.executable, "-m", "consumers.main", "run", "consumers.examples.counts:Counts",
                    "--etcd", etcd_url, "--root", root, "--zone", "demo", "--id", "consumer-1",
                    "--broker", ",".join(endpoints), "--data-dir", str(data_dir / "consumer"),
                    "--ttl", "5", "--log-format", "json"]
            console.print("running the count example: quire consumer run "
                          "consumers.examples.counts:Counts --zone demo --id consumer-1 …",
                          highlight=False)
            log = open(data_dir / "consumer.log", "ab")  # noqa: SIM115 - closed below
            member = subprocess.Popen(dying_with_us(argv), stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
            deadline = time.monotonic() + WAIT
            totals: dict[str, int] = {}
            while sum(totals.values()) < expected:
                if member.poll() is not None or time.monotonic() > deadline:
                    console.print(f"[red]consumer step: {sum(totals.values())} of {expected} "
                                  f"messages counted (log: {data_dir / 'consumer.log'})[/]")
                    return 1
                await asyncio.sleep(0.5)  # the member publishes totals on each commit
                totals = await _totals(client)
            status: list = []
            while time.monotonic() < deadline:  # reports are mirrored to etcd every second
                status = (await list_statuses(etcd, root)).get("demo-counts", [])
                if any(sum(x.offset for x in s.sources) >= sum(x.write_head for x in s.sources)
                       and s.sources and s.state.value == "PRIMARY" for s in status):
                    break
                await asyncio.sleep(0.2)
            view = make_table("quire shards list", ("id", "state", "primary", "read-through"))
            for s in status:
                view.add_row("demo-counts", s.state.value, s.member,
                             "\n".join(f"{x.journal}@{x.offset} (lag {x.lag})" for x in s.sources))
            console.print(view)
            top = make_table(f"counts per key from {OUTPUT} (top 5 of {len(totals)})",
                             ("key", "count"))
            for key, n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:5]:
                top.add_row(key, str(n))
            console.print(top)
            console.print(f"{sum(totals.values())} messages counted by shard demo-counts")
            return 0
    finally:
        if member is not None and member.poll() is None:
            member.send_signal(signal.SIGTERM)
            try:
                member.wait(30)
            except subprocess.TimeoutExpired:
                member.kill()
                member.wait(5)
        await etcd.close()


def consumer_step(endpoints: list[str], etcd_url: str, root: str, store: str, expected: int,
                  data_dir: Path) -> int:
    os.makedirs(data_dir, exist_ok=True)
    return asyncio.run(_run(endpoints, etcd_url, root, store, expected, data_dir))
