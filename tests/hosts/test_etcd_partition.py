"""etcd across three hosts (netns): a member partitioned from the other two still
accepts connections but has no leader; a client on it moves to a member that has one
(its status check) and writes go on; a watch through it misses no event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from topology.etcd import connect
from topology.watch import watch_events
from tests.etcd_writes import create_once
from tools.hosts import HostHarness
from tools.services.etcd import EtcdCluster


async def _put(client, key: bytes, value: bytes, within: float = 20.0):  # noqa: ANN001, ANN202
    """A write, retried while the cluster elects (a healed member without pre-vote
    forces an election when it rejoins with a higher term)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await asyncio.wait_for(client.put(key, value), 3.0)
        except Exception:  # noqa: BLE001 - request timed out / no leader / our member cut
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[HostHarness, EtcdCluster]]:
    with HostHarness(3) as h:
        yield h, h.etcd_cluster(h.hosts).start()


async def test_a_client_leaves_a_member_cut_from_the_quorum(
        hosts: tuple[HostHarness, EtcdCluster]) -> None:
    h, etcd = hosts
    client = await connect(etcd.url, probe=5.0)
    try:
        await _put(client, b"/p/before", b"1")
        member = next(m for m in etcd.members if m.port == client.current.port)
        cut = h.host_of(member.host)
        assert cut is not None
        others = [x for x in h.hosts if x is not cut]
        h.partition([cut], others)
        try:
            started = time.monotonic()
            done = None
            while done is None and time.monotonic() - started < 15.0:
                try:
                    await asyncio.wait_for(client.put(b"/p/during", b"2"), 3.0)
                    done = time.monotonic() - started
                except Exception:  # noqa: BLE001 - the member without a leader times out
                    await asyncio.sleep(0.1)
            assert done is not None, "writes never moved off the partitioned member"
            assert client.current.host != member.host
            print(f"\nclient left the partitioned etcd member after {done:.1f} s "
                  f"({client.failovers} failovers)")
            assert (await client.get(b"/p/before")).value == b"1"
        finally:
            h.heal_partitions()
    finally:
        await client.close()


async def test_a_watch_survives_its_member_being_cut(
        hosts: tuple[HostHarness, EtcdCluster]) -> None:
    h, etcd = hosts
    client = await connect(etcd.url, probe=5.0)
    writer = await connect(etcd.url, probe=5.0)
    seen: list[tuple[bytes, int]] = []  # (key, mod revision) of every event delivered
    ended: list[float] = []
    try:
        start_rev = await create_once(writer, b"/w/0", b"0")

        async def watch() -> None:
            # As the KeySpace does: when the stream ends (the cut member cancels it, as
            # it has no leader), watch again from the last revision seen + 1.
            rev = start_rev + 1
            while True:
                try:
                    async for resp in watch_events(client, b"/w/", rev, prefix=True):
                        seen.extend((event.kv.key, event.kv.mod_revision) for event in resp.events)
                        rev = resp.header.revision + 1
                except Exception:  # noqa: BLE001 - WatchEnded or the member's gRPC error
                    ended.append(time.monotonic())
                    await asyncio.sleep(0.1)

        task = asyncio.get_running_loop().create_task(watch())
        member = next(m for m in etcd.members if m.port == client.current.port)
        cut = h.host_of(member.host)
        assert cut is not None
        # Each key is written once, guarded by its create revision: a write retried after
        # a timeout may have been committed the first time (tests/etcd_writes.py). A blind
        # retry here once wrote /w/2 twice, and the watch rightly delivered both.
        written = [await create_once(writer, b"/w/1", b"1")]
        h.partition([cut], [x for x in h.hosts if x is not cut])
        try:
            for i in range(2, 6):
                written.append(await create_once(writer, f"/w/{i}".encode(), b"x"))
            deadline = time.monotonic() + 20
            while len(seen) < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            h.heal_partitions()
        task.cancel()
        # The watch's own guarantee: every event once, in revision order, none missed.
        assert seen == [(f"/w/{i}".encode(), rev) for i, rev in zip(range(1, 6), written)], \
            f"watch ended {len(ended)}x"
        assert client.current.host != member.host
    finally:
        await client.close()
        await writer.close()
