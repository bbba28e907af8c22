"""One member, one shard: restore-free start, counting, checkpoint notice, clean release."""

from __future__ import annotations

import json

import pytest

from protocol.shard import ShardSource, ShardSpec
from quire.client import Client
from topology.shards import ShardChange, apply_shards, list_statuses, read_primaries, request_checkpoint

from .conftest import create_journals, journal, wait_for

pytestmark = pytest.mark.timeout(90)


async def test_one_shard_counts(coordinators, member_factory, etcd_client, etcd_root) -> None:  # noqa: ANN001
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
        m = member_factory("zone-a", "mem-1")
        await m.ready()

        async def primary() -> bool:
            return (await read_primaries(etcd_client, etcd_root)).get("c-one", ("",))[0] == m.id

        await wait_for(primary, 20, "a primary")

        async def read_through() -> bool:
            st = (await list_statuses(etcd_client, etcd_root)).get("c-one", [])
            return any(s.state.value == "PRIMARY" and s.sources and
                       s.sources[0].offset == len(lines) for s in st)

        await wait_for(read_through, 20, "offsets to reach the write head")
        await request_checkpoint(etcd_client, etcd_root, "c-one")
        assert m.terminate() == 0, m.log_text()[-3000:]
        assert "c-one" not in await read_primaries(etcd_client, etcd_root)
        totals: dict[str, int] = {}
        async for _, data in client.read("out/counts", 0, end_offset=await client.write_head("out/counts")):
            for line in data.splitlines():
                row = json.loads(line)
                totals[row["key"]] = row["count"]
        assert totals == {f"k{i}": 20 for i in range(5)}
