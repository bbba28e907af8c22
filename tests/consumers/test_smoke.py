"""One member, one shard: restore-free start, counting, checkpoint notice, clean release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from protocol.shard import ShardSource, ShardSpec
from quire.client import Client
from topology.shards import ShardChange, apply_shards, list_statuses, read_primaries, request_checkpoint

from tools.services import free_port

from .conftest import create_journals, journal, wait_for

pytestmark = pytest.mark.timeout(90)


async def test_one_shard_counts(coordinators, member_factory, etcd, etcd_client, etcd_root) -> None:  # noqa: ANN001
    env = coordinators
    await create_journals(env, [journal("src/one", env.store_url), journal("out/counts", env.store_url),
                                journal("recovery/counts/c-one", env.store_url)])
    spec = ShardSpec(id="c-one", sources=(ShardSource(journal="src/one"),),
                     recovery_log_prefix="recovery/counts", checkpoint_interval=0.2)
    spec = ShardSpec(**{**{f: getattr(spec, f) for f in spec.__struct_fields__},
                        "labels": spec.labels.of(output="out/counts")})
    await apply_shards(etcd_client, etcd_root, [ShardChange(spec=spec)])
    async with Client(env.endpoints) as client:
        lines = b"".join(json.dumps({"key": f"k{i % 5}", "v": i}).encode() + b"\n" for i in range(100))
        await client.append("src/one", lines)
        port = free_port()
        m = member_factory("zone-a", "mem-1", metrics_port=port)
        await m.ready()

        async def primary() -> bool:
            return (await read_primaries(etcd_client, etcd_root)).get("c-one", ("",))[0] == m.id

        await wait_for(primary, 20, "a primary")

        async def read_through() -> bool:
            st = (await list_statuses(etcd_client, etcd_root)).get("c-one", [])
            return any(s.state.value == "PRIMARY" and s.sources and
                       s.sources[0].offset == len(lines) for s in st)

        await wait_for(read_through, 20, "offsets to reach the write head")
        # `quire shards list` shows the state, the primary and read-through offsets + lag.
        env_vars = {**os.environ, "QUIRE_ETCD_URL": etcd.url,
                    "QUIRE_ETCD_ROOT": etcd_root, "COLUMNS": "250"}
        listed = subprocess.run([sys.executable, "-m", "tools.cli.main", "shards", "list", "-o", "json"],
                                capture_output=True, text=True, env=env_vars, timeout=60)
        row = json.loads(listed.stdout.splitlines()[0])
        assert row["state"] == "PRIMARY" and row["primary"] == m.id, row
        assert row["sources"] == [{"journal": "src/one", "offset": len(lines),
                                   "write_head": len(lines), "lag": 0}], row
        assert row["transactions"] >= 1
        table = subprocess.run([sys.executable, "-m", "tools.cli.main", "shards", "list"],
                               capture_output=True, text=True, env=env_vars, timeout=60).stdout
        assert "PRIMARY" in table and f"src/one@{len(lines)} (lag 0 B)" in table, table
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'quire_shard_transactions_total{shard="c-one"}' in metrics
        assert 'quire_shard_messages_total{shard="c-one"} 100.0' in metrics
        assert 'quire_shard_lag_bytes{journal="src/one",shard="c-one"} 0.0' in metrics
        assert "quire_shard_transaction_seconds_bucket" in metrics
        assert "quire_shard_recovery_replay_bytes_total" in metrics
        await request_checkpoint(etcd_client, etcd_root, "c-one")
        # The checkpoint notice commits and snapshots; the snapshot writes prune guards.
        from topology.shards import guard_key

        async def guarded() -> object:
            return await etcd_client.get(guard_key(etcd_root, "src/one").encode())

        source_guard = await wait_for(guarded, 20, "the notice's snapshot to write guards")
        log_guard = await etcd_client.get(guard_key(etcd_root, "recovery/counts/c-one").encode())
        assert int(source_guard.value) == len(lines) and int(log_guard.value) > 0
        assert m.terminate() == 0, m.log_text()[-3000:]
        assert "c-one" not in await read_primaries(etcd_client, etcd_root)
        totals: dict[str, int] = {}
        async for _, data in client.read("out/counts", 0, end_offset=await client.write_head("out/counts")):
            for line in data.splitlines():
                row = json.loads(line)
                totals[row["key"]] = row["count"]
        assert totals == {f"k{i}": 20 for i in range(5)}



async def test_selector_source_picks_up_new_journals(coordinators, member_factory, etcd_client,  # noqa: ANN001
                                                     etcd_root) -> None:
    env = coordinators
    await create_journals(env, [journal("clicks/part-a", env.store_url, topic="clicks"),
                                journal("recovery/sel-1", env.store_url)])
    spec = ShardSpec(id="sel-1", sources=(ShardSource(selector="topic=clicks"),),
                     recovery_log_prefix="recovery", checkpoint_interval=0.1)
    await apply_shards(etcd_client, etcd_root, [ShardChange(spec=spec)])
    m = member_factory("zone-a", "mem-sel", selector_refresh=0.3)
    await m.ready()
    line = b'{"key": "k"}\n'
    async with Client(env.endpoints) as client:
        await client.append("clicks/part-a", line * 10)

        async def offsets() -> dict[str, int]:
            st = (await list_statuses(etcd_client, etcd_root)).get("sel-1", [])
            return {s.journal: s.offset for r in st if r.state.value == "PRIMARY" for s in r.sources}

        async def read(expected: dict[str, int]) -> bool:
            return await offsets() == expected

        await wait_for(lambda: read({"clicks/part-a": 10 * len(line)}), 20, "the first journal")
        await create_journals(env, [journal("clicks/part-b", env.store_url, topic="clicks")])
        await client.append("clicks/part-b", line * 5)
        await wait_for(lambda: read({"clicks/part-a": 10 * len(line), "clicks/part-b": 5 * len(line)}),
                       20, "the journal that matched later")
    assert m.terminate() == 0


async def test_a_failing_shard_is_reported_failed(coordinators, member_factory, etcd, etcd_client,  # noqa: ANN001
                                                  etcd_root) -> None:
    env = coordinators
    await create_journals(env, [journal("src/lonely", env.store_url)])
    # No recovery log journal: the shard cannot fence it, and says why.
    spec = ShardSpec(id="no-log", sources=(ShardSource(journal="src/lonely"),),
                     recovery_log_prefix="recovery")
    await apply_shards(etcd_client, etcd_root, [ShardChange(spec=spec)])
    m = member_factory("zone-a", "mem-fail")
    await m.ready()
    env_vars = {**os.environ, "QUIRE_ETCD_URL": etcd.url, "QUIRE_ETCD_ROOT": etcd_root}

    def listed() -> dict | None:
        out = subprocess.run([sys.executable, "-m", "tools.cli.main", "shards", "list", "-o", "json"],
                             capture_output=True, text=True, env=env_vars, timeout=60)
        row = json.loads(out.stdout.splitlines()[0])
        return row if row["state"] == "FAILED" else None

    row = await wait_for(listed, 30, "a FAILED report", interval=0.5)
    assert "JOURNAL_NOT_FOUND" in row["message"] and "recovery/no-log" in row["message"], row
    assert m.terminate() == 0
