"""A coordinator proxying an append to a primary whose host is isolated (a silent link:
a connect gets no answer, no RST) neither hangs on its connect nor gives up: it tries
the primary with a short connect timeout, resolves the journal again from its own etcd
watch, and forwards the append to the new primary once one is named — one RPC from the
client's side, answered OK (#31). Nothing of the append reached the old primary before
it was re-routed, so exactly-once is untouched: the content is in the journal once.

Seven hosts: a three-member etcd on three of them (never isolated here), a coordinator
on each of the other four (lease TTL 3 s), a replication-2 journal — so two coordinators
are outside its route and proxy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from protocol import FragmentSpec, JournalSpec, Status
from protocol.fragment import Codec
from quire.client import Client
from tests.coordinator.cluster import Conn
from tests.hosts.hosts_cluster import HostsCluster, primary_of, start_coordinators, until
from tools.hosts import HostHarness

pytestmark = pytest.mark.timeout(240)

JOURNAL = "hosts/proxied"
LEASE_TTL = 3
ZONES = ["e", "e", "e", "a", "b", "c", "d"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[HostsCluster]:
    with HostHarness(len(ZONES), zones=ZONES) as h:
        etcd = h.etcd_cluster(h.hosts[:3]).start()
        yield start_coordinators(h, etcd, h.hosts[3:], root="/quire-proxy", lease_ttl=LEASE_TTL)


async def _primary(client: Client) -> tuple[str, tuple[str, ...]]:
    return await primary_of(client, JOURNAL)


async def test_a_proxied_append_moves_to_the_new_primary_of_an_isolated_ones_journal(
        cluster: HostsCluster) -> None:
    async with Client(cluster.endpoints, rpc_timeout=5.0) as client:
        await client.apply([JournalSpec(name=JOURNAL, replication=2, fragment=FragmentSpec(
            length=1 << 20, compression_codec=Codec.NONE))])
        await until("the journal to take appends", 60, lambda: client.append(JOURNAL, b""))

        async def settled() -> tuple[str, tuple[str, ...]] | None:
            primary, members = await _primary(client)
            return (primary, members) if primary and len(members) == 2 and all(members) else None

        old, members = await until("a primary with two members", 60, settled)
        proxy, reader_at = [e for e in cluster.endpoints if e not in members][:2]
        conn = await Conn.open(proxy)
        warm = await conn.append(JOURNAL, [b"proxied before the isolation\n"])
        assert warm.status == Status.OK, warm
        old_host = cluster.host_at(old)
        data = b"proxied while the primary's host is isolated\n"
        cluster.h.isolate(old_host)
        isolated_at = time.monotonic()
        try:
            # The proxy's route still names the isolated primary (its lease lives up to
            # the TTL): it must find the new one itself. Before the fix it waited out a
            # 5 s connect and answered UNAVAILABLE.
            r = await conn.append(JOURNAL, [data])
            answered = time.monotonic() - isolated_at
            assert r.status == Status.OK, r
            now, _ = await until("another primary", 30, lambda: settled())
            assert now != old
            print(f"\nproxied append through {proxy} with its primary's host isolated: "
                  f"acknowledged by the new primary {now} after {answered:.1f} s "
                  f"(lease TTL {LEASE_TTL} s)")
        finally:
            await conn.close()
            cluster.h.heal(old_host)
        reader = await Conn.open(reader_at)
        try:
            got, _ = await reader.read(JOURNAL, r.commit.begin, end_offset=r.commit.end)
            assert got == data
            # Up to the commit's end, from a member that was never cut off: the healed
            # old primary may still answer a write head from before its isolation.
            everything, _ = await reader.read(JOURNAL, 0, end_offset=r.commit.end)
            assert everything.count(data) == 1
        finally:
            await reader.close()
