"""KeySpace mirror, Membership, Resolver and route advertisement against a real etcd."""

from __future__ import annotations

import asyncio

import aetcd
import msgspec
import pytest

from topology.assignments import advertise_route, is_consistent, route_of
from topology.etcd import (
    AssignmentConflict,
    DuplicateMember,
    assignment_key,
    connect,
    journal_key,
    member_key,
)
from topology.keyspace import KeySpace
from topology.membership import BrokerSpec, Membership
from coordinator.resolver import Resolver
from coordinator.specs import apply_specs
from protocol import JournalSpec, ProcessId, Route, Status
from protocol.messages import ApplyChange
from tools.services import EtcdService

from .conftest import wait_until

A, B, C = ProcessId("a", "broker-1"), ProcessId("a", "broker-2"), ProcessId("b", "broker-3")


async def add_journal(client: aetcd.Client, root: str, name: str, replication: int = 2) -> int:
    return await apply_specs(client, root, [ApplyChange(
        upsert=JournalSpec(name=name, replication=replication))])


async def assign(client: aetcd.Client, root: str, journal: str, pid: ProcessId, slot: int,
                 lease: int = 0, value: bytes = b"{}") -> None:
    await client.put(assignment_key(root, journal, pid, slot).encode(), value, lease=lease or None)


async def test_load_then_watch(client: aetcd.Client, etcd_root: str) -> None:
    await add_journal(client, etcd_root, "logs/one")
    calls: list[int] = []
    async with KeySpace(client, etcd_root) as ks:
        ks.on_change.append(lambda k: calls.append(k.revision))
        assert set(ks.journals) == {"logs/one"}
        rev = await add_journal(client, etcd_root, "logs/two")
        assert await ks.wait_for_revision(rev, timeout=5)
        assert set(ks.journals) == {"logs/one", "logs/two"}
        assert ks.journals["logs/two"].mod_revision == rev
        assert calls and calls[-1] == rev
        await assign(client, etcd_root, "logs/two", B, 1)
        await assign(client, etcd_root, "logs/two", A, 0)
        await wait_until(ks, lambda: len(ks.assignments("logs/two")) == 2, 5)
        assert [(a.member, a.slot) for a in ks.assignments("logs/two")] == [(A, 0), (B, 1)]
        assert [a.journal for a in ks.assignments_of(B)] == ["logs/two"]
        assert ks.assignments("logs/two")[0].value is None
        await client.delete(journal_key(etcd_root, "logs/one").encode())
        await wait_until(ks, lambda: "logs/one" not in ks.journals, 5)


async def test_malformed_values_are_skipped(client: aetcd.Client, etcd_root: str) -> None:
    await client.put(journal_key(etcd_root, "logs/bad").encode(), b"{not json")
    await client.put(f"{etcd_root}/members/not-a-pid".encode(), b"{}")
    await add_journal(client, etcd_root, "logs/good")
    async with KeySpace(client, etcd_root) as ks:
        assert set(ks.journals) == {"logs/good"}
        assert ks.members == {}
        # A good value turning bad drops the entry instead of keeping a stale one.
        await client.put(journal_key(etcd_root, "logs/good").encode(), b"[]")
        await wait_until(ks, lambda: "logs/good" not in ks.journals, 5)


async def test_wait_for_revision_outside_the_prefix(client: aetcd.Client, etcd_root: str) -> None:
    async with KeySpace(client, etcd_root) as ks:
        # A write elsewhere produces no event for us; a progress request proves we are current.
        put = await client.put(f"{etcd_root}-elsewhere/x".encode(), b"1")
        try:
            assert await ks.wait_for_revision(put.header.revision, timeout=5)
            assert not await ks.wait_for_revision(put.header.revision + 1000, timeout=0.3)
        finally:
            await client.delete(f"{etcd_root}-elsewhere/x".encode())


async def test_wait_changed_is_condition_based(client: aetcd.Client, etcd_root: str) -> None:
    async with KeySpace(client, etcd_root) as ks:
        seen = ks.changed_revision
        assert not await ks.wait_changed(seen, timeout=0.2)
        waiter = asyncio.create_task(ks.wait_changed(seen, timeout=5))
        await add_journal(client, etcd_root, "logs/x")
        assert await waiter


async def test_membership_lifecycle(client: aetcd.Client, etcd_root: str) -> None:
    spec = BrokerSpec(id=A, endpoint="127.0.0.1:1", journal_limit=7)
    async with KeySpace(client, etcd_root) as ks:
        async with Membership(client, etcd_root, spec, ttl=5) as m:
            await wait_until(ks, lambda: A in ks.members, 5)
            assert ks.members[A].lease == m.lease_id
            assert ks.members[A].spec.journal_limit == 7
            with pytest.raises(DuplicateMember):
                async with Membership(client, etcd_root, spec, ttl=5):
                    pass
            await m.set_exiting()
            await wait_until(ks, lambda: ks.members[A].spec.exiting, 5)
            await assign(client, etcd_root, "logs/x", A, 0, lease=m.lease_id)
            await wait_until(ks, lambda: ks.assignments_of(A), 5)
        # Revoking the lease removes the member and everything written under it.
        await wait_until(ks, lambda: A not in ks.members and not ks.assignments_of(A), 5)
    raw = await client.get(member_key(etcd_root, A).encode())
    assert raw is None


async def test_membership_waits_for_a_previous_incarnation(client: aetcd.Client,
                                                           etcd_root: str) -> None:
    spec = BrokerSpec(id=A)
    lease = await client.lease(2)
    await client.put(member_key(etcd_root, A).encode(), msgspec.json.encode(spec), lease=lease)
    # The old key dies with its lease (about 2 s); the new incarnation waits for that.
    async with Membership(client, etcd_root, spec, ttl=5, wait_absent=10) as m:
        raw = await client.get(member_key(etcd_root, A).encode())
        assert raw.lease == m.lease_id


async def test_membership_keeps_its_lease_alive_while_waiting(client: aetcd.Client,
                                                              etcd_root: str) -> None:
    """A restart within the old member's TTL: the wait for the old key (about 4 s) is
    longer than the new lease's own TTL (1 s), so the new lease must be kept alive
    while waiting, or the put fails with "requested lease not found"."""
    spec = BrokerSpec(id=B)
    old = await client.lease(4)
    await client.put(member_key(etcd_root, B).encode(), msgspec.json.encode(spec), lease=old)
    async with KeySpace(client, etcd_root) as ks:
        async with Membership(client, etcd_root, spec, ttl=1, wait_absent=10) as m:
            raw = await client.get(member_key(etcd_root, B).encode())
            assert raw.lease == m.lease_id
            assert not m.lost.is_set()
            await wait_until(ks, lambda: B in ks.members and ks.members[B].lease == m.lease_id, 5)
        await wait_until(ks, lambda: B not in ks.members, 5)


async def test_resolver_statuses(client: aetcd.Client, etcd_root: str) -> None:
    async with KeySpace(client, etcd_root) as ks:
        res = Resolver(ks, A)
        assert (await res.resolve("logs/x")).status == Status.JOURNAL_NOT_FOUND
        rev = await add_journal(client, etcd_root, "logs/x")
        r = await res.resolve("logs/x", min_revision=rev)  # a future revision is waited for
        assert r.status == Status.INSUFFICIENT_JOURNAL_BROKERS
        assert r.header.etcd.revision >= rev and r.header.process_id == A
        async with Membership(client, etcd_root, BrokerSpec(id=C, endpoint="h:3"), ttl=5), \
                Membership(client, etcd_root, BrokerSpec(id=A, endpoint="h:1"), ttl=5):
            await assign(client, etcd_root, "logs/x", C, 1)
            await wait_until(ks, lambda: len(ks.assignments("logs/x")) == 1 and len(ks.members) == 2, 5)
            r = await res.resolve("logs/x")
            assert r.status == Status.OK and r.is_member is False and r.route.primary == -1
            assert (await res.resolve("logs/x", require_primary=True)).status == \
                Status.NO_JOURNAL_PRIMARY_BROKER
            await assign(client, etcd_root, "logs/x", A, 0)
            await wait_until(ks, lambda: len(ks.assignments("logs/x")) == 2, 5)
            r = await res.resolve("logs/x", require_primary=True)
            assert r.status == Status.OK and r.is_primary and r.is_member
            assert r.route.members == (A, C) and r.route.endpoints == ("h:1", "h:3")
            assert r.primary_endpoint == "h:1"


async def test_resolver_keeps_an_answer_per_revision_and_standing(client: aetcd.Client,
                                                                     etcd_root: str) -> None:
    """resolve_now's answer is kept while the mirror's revision and may_lead() hold (the
    backlog, route gaps and persister ask for every hosted journal every 5 s: #49), and
    is made anew once either moves: a route change, or a lost standing that steps us down."""
    async with KeySpace(client, etcd_root) as ks:
        res = Resolver(ks, A)
        await add_journal(client, etcd_root, "logs/m")
        await assign(client, etcd_root, "logs/m", A, 0)
        await wait_until(ks, lambda: len(ks.assignments("logs/m")) == 1, 5)
        first = res.resolve_now("logs/m")
        assert first.is_primary and first.current
        assert res.resolve_now("logs/m") is first
        assert res.resolve_now("logs/m", require_primary=True) is not first  # (its own memo)
        assert res.resolve_now("logs/none").status == Status.JOURNAL_NOT_FOUND
        standing = [False]
        res.may_lead = lambda: standing[0]
        down = res.resolve_now("logs/m")
        assert not down.is_primary and not down.current and down.route.primary == -1
        standing[0] = True
        assert res.resolve_now("logs/m").is_primary
        await assign(client, etcd_root, "logs/m", C, 1)
        await wait_until(ks, lambda: len(ks.assignments("logs/m")) == 2, 5)
        moved = res.resolve_now("logs/m")
        assert moved.route.members == (A, C) and moved.revision > first.revision
        assert res.resolve_now("logs/m") is moved


async def test_advertise_route(client: aetcd.Client, etcd_root: str) -> None:
    async with KeySpace(client, etcd_root) as ks:
        await assign(client, etcd_root, "logs/x", A, 0)
        await assign(client, etcd_root, "logs/x", C, 1)
        await wait_until(ks, lambda: len(ks.assignments("logs/x")) == 2, 5)
        route = route_of(ks.assignments("logs/x"))
        assert route == Route(members=(A, C), primary=0)
        assert not is_consistent(ks.assignments("logs/x"))
        rev = await advertise_route(client, ks, "logs/x", route)
        assert rev > 0 and await ks.wait_for_revision(rev, 5)
        assert is_consistent(ks.assignments("logs/x"))
        assert await advertise_route(client, ks, "logs/x", route) == 0  # nothing to change
        with pytest.raises(AssignmentConflict):  # a stale route is refused
            await advertise_route(client, ks, "logs/x", Route(members=(A, B), primary=0))
        # A change the mirror has not seen when the write happens is refused too: a
        # KeySpace that stopped watching is a frozen (stale) view.
        await assign(client, etcd_root, "logs/x", B, 2)
        await wait_until(ks, lambda: len(ks.assignments("logs/x")) == 3, 5)
        async with KeySpace(client, etcd_root) as frozen:
            pass
        new_route = route_of(ks.assignments("logs/x"))
        assert await advertise_route(client, ks, "logs/x", new_route) > 0
        with pytest.raises(AssignmentConflict):
            await advertise_route(client, frozen, "logs/x", new_route)


async def test_keyspace_survives_etcd_restart(etcd_root: str) -> None:
    with EtcdService("etcd-restart") as etcd:
        c = await connect(etcd.url)
        try:
            async with KeySpace(c, etcd_root) as ks:
                await add_journal(c, etcd_root, "logs/before")
                await wait_until(ks, lambda: "logs/before" in ks.journals, 5)
                await asyncio.to_thread(etcd.stop)
                await asyncio.to_thread(etcd.start)
                # Same data dir: the mirror re-lists and keeps following new writes.
                for _ in range(50):  # the client channel reconnects on its own schedule
                    try:
                        rev = await add_journal(c, etcd_root, "logs/after")
                        break
                    except Exception:  # noqa: BLE001 - etcd still coming back
                        await asyncio.sleep(0.2)
                assert await ks.wait_for_revision(rev, timeout=15)
                assert {"logs/before", "logs/after"} <= set(ks.journals)
                await c.delete(journal_key(etcd_root, "logs/x-late").encode())
                rev = await add_journal(c, etcd_root, "logs/later")
                await wait_until(ks, lambda: "logs/later" in ks.journals, 5)
        finally:
            await c.close()


async def test_assignment_indexes_follow_every_change(client: aetcd.Client, etcd_root: str) -> None:
    """The cached per-journal order and the per-member index equal a full scan after
    puts, value changes, deletes and a re-list."""
    def check(ks: KeySpace) -> None:
        every = [a for by in ks._assign.values() for a in by.values()]  # noqa: SLF001
        for journal in {a.journal for a in every} | {"logs/none"}:
            assert ks.assignments(journal) == sorted(
                (a for a in every if a.journal == journal), key=lambda a: (a.slot, a.member))
        for pid in (A, B, C):
            assert ks.assignments_of(pid) == sorted(
                (a for a in every if a.member == pid), key=lambda a: (a.journal, a.slot))

    async with KeySpace(client, etcd_root) as ks:
        for i, pid in enumerate((A, B, C)):
            await assign(client, etcd_root, "logs/x", pid, i)
            await assign(client, etcd_root, f"logs/{pid.suffix}", pid, 0)
        await wait_until(ks, lambda: len(ks.assignments("logs/x")) == 3, 5)
        check(ks)
        ks.assignments("logs/x").clear()  # a caller's copy: the cache is not theirs
        await assign(client, etcd_root, "logs/x", B, 1, value=b'{"members": [{"zone": "a", "suffix": "broker-2"}]}')
        await client.delete(assignment_key(etcd_root, "logs/x", C, 2).encode())
        await wait_until(ks, lambda: len(ks.assignments("logs/x")) == 2
                         and ks.assignments("logs/x")[1].value is not None, 5)
        check(ks)
        await ks._load()  # noqa: SLF001 - the re-list path rebuilds the indexes
        check(ks)
        assert [a.journal for a in ks.assignments_of(C)] == ["logs/broker-3"]


async def test_touched_names_the_journals_a_batch_changed(client: aetcd.Client,
                                                          etcd_root: str) -> None:
    """Followers re-examine the journals a batch touched (coordinator/hosting.py);
    a member key (or a re-list) touches everything: None."""
    seen: list[set[str] | None] = []
    async with KeySpace(client, etcd_root) as ks:
        ks.on_change.append(lambda k: seen.append(None if k.touched is None else set(k.touched)))
        assert ks.touched is None  # the load
        rev = await add_journal(client, etcd_root, "touch/a")
        assert await ks.wait_for_revision(rev, timeout=5)
        assert seen[-1] == {"touch/a"}
        await assign(client, etcd_root, "touch/b", A, 0)
        await wait_until(ks, lambda: len(ks.assignments("touch/b")) == 1, 5)
        assert seen[-1] == {"touch/b"}
        spec = BrokerSpec(id=B, endpoint="127.0.0.1:1")
        await client.put(member_key(etcd_root, B).encode(), msgspec.json.encode(spec))
        await wait_until(ks, lambda: B in ks.members, 5)
        assert seen[-1] is None


async def test_concurrent_catch_ups_share_one_prefix_read(client: aetcd.Client,
                                                          etcd_root: str) -> None:
    """Many waiters for a revision written outside the prefix (no event will announce
    it) cost etcd one read of the prefix at a time, not one each."""
    await add_journal(client, etcd_root, "share/a")
    async with KeySpace(client, etcd_root) as ks:
        reads = 0
        real = client.get_prefix

        async def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            nonlocal reads
            reads += 1
            return await real(*args, **kwargs)

        client.get_prefix = counted  # type: ignore[method-assign]
        try:
            outside = await client.put(f"{etcd_root}-elsewhere/x".encode(), b"1")
            rev = outside.header.revision
            waiters = [ks.wait_for_revision(rev, timeout=10) for _ in range(50)]
            assert all(await asyncio.gather(*waiters))
        finally:
            client.get_prefix = real  # type: ignore[method-assign]
        assert 1 <= reads < 10, reads


async def test_a_root_larger_than_grpcs_default_limit_loads(client: aetcd.Client,
                                                           etcd_root: str) -> None:
    """10,000 journals at R=3 are ~13 MB under the root: a load (start, re-list) must not
    be refused as over gRPC's default 4 MiB answer (it was: RESOURCE_EXHAUSTED)."""
    from topology.etcd import put_op, txn

    value = b"v" * 4000
    for k in range(0, 1200, 100):  # ~5 MB, keys the mirror does not decode
        await txn(client, [], [put_op(f"{etcd_root}/blob/{i:04d}", value)
                               for i in range(k, k + 100)])
    async with KeySpace(client, etcd_root) as ks:  # one range read of all of it
        assert ks.revision > 0
        assert sum(key.startswith(f"{etcd_root}/blob/".encode()) for key in ks._mods) == 1200
