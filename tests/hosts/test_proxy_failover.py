"""A coordinator proxying an append to a primary whose host is isolated (a silent link:
a connect gets no answer, no RST) neither hangs on its connect nor gives up: it tries
the primary with a short connect timeout, resolves the journal again from its own etcd
watch, and forwards the append to the new primary once one is named — one RPC from the
client's side, answered OK (#31). Nothing of the append reached the old primary before
it was re-routed, so exactly-once is untouched: the content is in the journal once.

And a primary cut off from etcd and its peers (but not from its readers) never tells a
reader a write head it cannot vouch for — not while it is cut off, when a new primary
takes appends, nor once it is back: until its lease is confirmed and its watch has caught
up with the revision that confirmation dates from, it answers a read at the head
UNAVAILABLE (the reader asks another member); afterwards it knows the new head, or that
it no longer holds the journal.

Seven hosts: a three-member etcd on three of them (never isolated here), a coordinator
on each of the other four (lease TTL 3 s), a replication-2 journal — so two coordinators
are outside its route and proxy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from protocol import FragmentSpec, JournalSpec, ReadRequest, ReadResponse, Status
from protocol.errors import QuireError
from protocol.fragment import Codec
from quire.client import Client
from tests.coordinator.cluster import Conn
from tests.hosts.hosts_cluster import HostsCluster, NotYet, primary_of, start_coordinators, until
from tools.hosts import HostHarness

pytestmark = pytest.mark.timeout(240)

JOURNAL = "hosts/proxied"
HEAD_JOURNAL = "hosts/head"
LEASE_TTL = 3
ZONES = ["e", "e", "e", "a", "b", "c", "d"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[HostsCluster]:
    with HostHarness(len(ZONES), zones=ZONES) as h:
        etcd = h.etcd_cluster(h.hosts[:3]).start()
        yield start_coordinators(h, etcd, h.hosts[3:], root="/quire-proxy", lease_ttl=LEASE_TTL)


Placement = tuple[str, tuple[str, ...]]


async def _serve(client: Client, journal: str) -> Callable[[], Awaitable[Placement | None]]:
    """Make an R=2 journal and wait until it takes appends; returns `settled()`: its
    (primary, members) once it has a primary and two advertised members, else None."""
    await client.apply([JournalSpec(name=journal, replication=2, fragment=FragmentSpec(
        length=1 << 20, compression_codec=Codec.NONE))])
    await until("the journal to take appends", 60, lambda: client.append(journal, b""))

    async def settled() -> Placement | None:
        primary, members = await primary_of(client, journal)
        return (primary, members) if primary and len(members) == 2 and all(members) else None

    return settled


async def test_a_proxied_append_moves_to_the_new_primary_of_an_isolated_ones_journal(
        cluster: HostsCluster) -> None:
    async with Client(cluster.endpoints, rpc_timeout=5.0) as client:
        settled = await _serve(client, JOURNAL)

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


async def _head_at(endpoint: str, journal: str) -> tuple[Status, int]:
    """One member's own answer (never proxied) to a read at the write head."""
    async with asyncio.timeout(5.0):
        conn = await Conn.open(endpoint)
        try:
            await conn.s.send(ReadRequest(journal=journal, offset=-1, metadata_only=True,
                                          do_not_proxy=True))
            m, _ = await conn.s.read_message(ReadResponse)
            return m.status, m.write_head
        finally:
            conn.s.abort()


async def test_a_healed_former_primary_never_tells_a_write_head_from_before_its_isolation(
        cluster: HostsCluster) -> None:
    async with Client(cluster.endpoints, rpc_timeout=5.0) as client:
        settled = await _serve(client, HEAD_JOURNAL)

        old, _ = await until("a primary with two members", 60, settled)
        before = await client.append(HEAD_JOURNAL, b"before the isolation\n")
        old_host = cluster.host_at(old)
        cluster.h.partition([old_host], [h for h in cluster.h.hosts if h is not old_host])
        answers: list[tuple[Status, int]] = []
        try:
            async def moved() -> Placement | None:
                got = await settled()
                return got if got and got[0] != old else None

            await until("another primary", 60, moved)
            after = await until("an append by the new primary", 60,
                                lambda: client.append(HEAD_JOURNAL, b"while it is away\n"))
            assert after.commit.end > before.commit.end
            # Still cut off from etcd and its peers, reachable by us: it refuses
            # (UNAVAILABLE), or says it does not hold the journal (its watch saw the new
            # route before the cut bit), never its own old head. (Before the fix:
            # OFFSET_NOT_YET_AVAILABLE at the head of before the cut.)
            status, head = await _head_at(old, HEAD_JOURNAL)
            answers.append((status, head))
            assert status in (Status.UNAVAILABLE, Status.NOT_JOURNAL_BROKER) \
                or head >= after.commit.end, (
                    f"{old}, cut off, told the write head {head} (the journal's is "
                    f"{after.commit.end}): {status.name}")
        finally:
            cluster.h.heal_partitions()

        async def knows() -> bool | NotYet:
            try:
                status, head = await _head_at(old, HEAD_JOURNAL)
            except (QuireError, OSError, asyncio.TimeoutError) as exc:
                return NotYet(f"{old}: {exc!r}")  # not reachable yet: not an answer
            answers.append((status, head))
            if status in (Status.OK, Status.OFFSET_NOT_YET_AVAILABLE):
                assert head >= after.commit.end, (
                    f"{old} told the write head {head} from before its isolation "
                    f"(the journal's head is {after.commit.end}); its answers: {answers}")
                return True
            if status == Status.NOT_JOURNAL_BROKER:
                return True  # it learnt that the journal moved away
            return NotYet(f"{old} answered {status.name}")

        await until("the healed former primary to answer at the head", 60, knows)
        refused = sum(1 for st, _ in answers if st == Status.UNAVAILABLE)
        print(f"\nformer primary {old}, cut off then healed: {len(answers)} answers at the head, "
              f"{refused} refused UNAVAILABLE, last {answers[-1]}")
