"""A consumer shard's primary lock deleted by hand (`etcdctl del <root>/consumers/primary/
<shard>`), on a 3-member word-count group over 3 coordinators, while input streams in:
the member that held it notices through its own watch, stops writing the shard, and the
shard has exactly one primary again within the lease TTL + 2 s (its old holder again, or
the allocator's choice); no shard ever has two locks or two PRIMARY reports, and the
counts rebuilt from the recovery logs equal the model exactly."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from consumers.plan import placement
from quire.client import Client
from topology.allocator_plan import MemberState
from topology.etcd import members_prefix
from topology.membership import BrokerSpec
from topology.shards import consumer_root, list_shards, read_primaries
from tests.consumers.conftest import coordinators, etcd_client, member_factory, wait_for  # noqa: F401
from tests.consumers.test_failover import (caught_up, diagnosed, led_group, model, replayed_counts,
                                           write)

pytestmark = pytest.mark.timeout(240)

SHARDS = 3
MESSAGES = 6000
TTL = 3.0


async def placement_settled(etcd_client, root: str) -> bool:  # noqa: ANN001
    """Every shard's lock held by the member the placement makes its primary, as each
    member computes it (consumers.plan.placement over the shard specs and the members'
    keys). Until then a member may release a shard it leads to hand it over: were that
    the shard whose lock the test deletes, it would stop through the hand-over, not
    through noticing the deletion (CI, 2026-11-29: "shard stopped" and no "shard lock
    lost", the lock deleted just as its first holder handed it to the placement's choice)."""
    specs = [e.spec for e in await list_shards(etcd_client, root)]
    members = []
    for kv in (await etcd_client.get_prefix(members_prefix(consumer_root(root)).encode())).kvs:
        b = msgspec.json.decode(kv.value, type=BrokerSpec)
        members.append(MemberState(b.id, b.journal_limit, b.exiting))
    want = placement(specs, members)
    locks = await read_primaries(etcd_client, root)
    return len(members) == 3 and all(
        bool(ranked) and locks.get(shard, ("",))[0] == str(ranked[0]) for shard, ranked in want.items())


async def test_a_deleted_shard_lock_is_noticed_and_the_shard_led_again(  # noqa: ANN001
        coordinators, member_factory, etcd_client, etcd_root) -> None:  # noqa: F811
    env = coordinators
    async with Client(env.endpoints) as client:
        async with led_group(env, member_factory, etcd_client, etcd_root, SHARDS,
                             ttl=TTL) as (members, watcher):
            await write(client, 0, MESSAGES // 2, SHARDS)
            await wait_for(lambda: placement_settled(etcd_client, etcd_root), 30,
                           "every shard led by the member the placement chose")
            shard = "count-0"
            holder, _ = (await read_primaries(etcd_client, etcd_root))[shard]
            writing = asyncio.create_task(write(client, MESSAGES // 2, MESSAGES, SHARDS))
            key = f"{consumer_root(etcd_root)}/primary/{shard}"
            await etcd_client.delete(key.encode())
            deleted_at = time.monotonic()

            async def led_again() -> bool:
                now = await read_primaries(etcd_client, etcd_root)
                return shard in now

            await wait_for(led_again, TTL + 2.0, "the shard to be led again within TTL + 2 s")
            relock = time.monotonic() - deleted_at
            await writing
            await diagnosed(wait_for(lambda: caught_up(client, etcd_client, etcd_root, SHARDS), 90,
                                     "shards to read everything"), members, etcd_client, etcd_root)
            logs = "".join(m.log_text() for m in members)
            said = [line for line in logs.splitlines()
                    if any(w in line for w in ("lost", "failed", "fenc", "stopped"))]
            assert "shard lock lost" in logs, ("the holder noticed through its own watch",
                                               said[-20:])
            for m in members:
                assert m.proc.poll() is None, m.log_text()[-3000:]
            for m in members:
                assert m.terminate() == 0, m.log_text()[-3000:]
        assert watcher.polls > 5
        assert not watcher.violations, watcher.violations[:5]
        expected = model(MESSAGES, SHARDS)
        for i in range(SHARDS):
            assert await replayed_counts(client, f"count-{i}") == expected[f"count-{i}"], f"count-{i}"
    print(f"\nlock of {shard} (held by {holder}) deleted: led again after {relock:.1f}s")
