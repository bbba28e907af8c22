"""Hot standby: it tails the recovery log (STANDBY in etcd), and on kill -9 of the primary
it takes over replaying only what it had not yet applied — no snapshot, no full replay."""

from __future__ import annotations

import json
import signal

import pytest

from protocol import LabelSet
from protocol.shard import ShardSource, ShardSpec
from quire.client import Client
from topology.shards import ShardChange, apply_shards, list_statuses, read_primaries

from .conftest import create_journals, journal, wait_for
from .test_failover import caught_up, model, replayed_counts, write

pytestmark = pytest.mark.timeout(90)


async def test_standby_takes_over_without_full_replay(coordinators, member_factory, etcd_client,  # noqa: ANN001
                                                      etcd_root) -> None:
    env = coordinators
    await create_journals(env, [journal("src/part-0", env.store_url),
                                journal("recovery/count-0", env.store_url)])
    spec = ShardSpec(id="count-0", sources=(ShardSource(journal="src/part-0"),),
                     recovery_log_prefix="recovery", hot_standbys=1, checkpoint_interval=0.1,
                     labels=LabelSet.of(app="counts"))
    await apply_shards(etcd_client, etcd_root, [ShardChange(spec=spec)])
    members = [member_factory("zone-a", "mem-a", snapshot_interval=3600),
               member_factory("zone-b", "mem-b", snapshot_interval=3600)]
    for m in members:
        await m.ready()
    async with Client(env.endpoints) as client:
        async def roles() -> dict[str, str] | None:
            st = (await list_statuses(etcd_client, etcd_root)).get("count-0", [])
            states = {s.member: s.state.value for s in st}
            return states if sorted(states.values()) == ["PRIMARY", "STANDBY"] else None

        await wait_for(roles, 30, "a primary and a standby")
        await write(client, 0, 3000, 1)
        await wait_for(lambda: caught_up(client, etcd_client, etcd_root, 1), 30, "the primary")
        log_head = await client.write_head("recovery/count-0")

        async def standby_current() -> bool:
            st = (await list_statuses(etcd_client, etcd_root)).get("count-0", [])
            return any(s.state.value == "STANDBY" and s.log_offset >= log_head for s in st)

        await wait_for(standby_current, 30, "the standby to tail the log")
        primary_id = (await read_primaries(etcd_client, etcd_root))["count-0"][0]
        primary = next(m for m in members if m.id == primary_id)
        standby = next(m for m in members if m is not primary)
        primary.signal(signal.SIGKILL)

        async def promoted() -> bool:
            return (await read_primaries(etcd_client, etcd_root)).get("count-0", ("",))[0] == standby.id

        await wait_for(promoted, 20, "the standby to take the lock")
        await write(client, 3000, 4000, 1)
        await wait_for(lambda: caught_up(client, etcd_client, etcd_root, 1), 30, "the new primary")
        replays = [json.loads(line) for line in standby.log_text().splitlines()
                   if '"recovery log replayed"' in line]
        assert replays and replays[-1]["begin"] >= log_head, replays
        assert "snapshot restored" not in standby.log_text()
        assert standby.terminate() == 0
        assert await replayed_counts(client, "count-0") == model(4000, 1)["count-0"]
