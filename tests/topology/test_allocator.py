"""The allocator against real etcd: election in-process, then member processes.

The member processes are `python -m topology.topology_member --advertise`: as slot 0
of a journal they advertise its route, standing in for a primary's pipeline sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable

import aetcd
import pytest

from topology.allocator import Allocator
from topology.assignments import is_consistent
from topology.keyspace import KeySpace
from topology.membership import BrokerSpec, Membership
from coordinator.specs import apply_specs
from protocol import JournalSpec, ProcessId
from protocol.messages import ApplyChange

from .conftest import Member, wait_until

TTL = 3.0


async def add_journals(client: aetcd.Client, root: str, n: int, replication: int = 3) -> list[str]:
    names = [f"logs/part-{i:03d}" for i in range(n)]
    await apply_specs(client, root, [ApplyChange(upsert=JournalSpec(name=n_, replication=replication))
                                     for n_ in names])
    return names


def describe(ks: KeySpace, journals: list[str]) -> str:
    """The topology and the plan the leader would make now (for failure messages)."""
    from topology.allocator import snapshot
    from topology.allocator_plan import plan

    lines = [f"leader={ks.leader.member if ks.leader else None} members="
             f"{sorted((str(p), m.spec.exiting) for p, m in ks.members.items())}"]
    for j in journals:
        lines.append(f"  {j}: " + ", ".join(
            f"{a.member}#{a.slot}{'' if a.value is None else '+'}" for a in ks.assignments(j))
            + f" consistent={is_consistent(ks.assignments(j))}")
    lines.append(f"  plan: {plan(snapshot(ks))}")
    return "\n".join(lines)


def placement_ok(ks: KeySpace, journals: list[str], replication: int) -> bool:
    """Every journal fully placed on live non-exiting members, one primary, consistent,
    loads within one of each other, spread over two zones when there are two."""
    live = {p for p, m in ks.members.items() if not m.spec.exiting}
    want = min(replication, len(live))
    zones = {p.zone for p in live}
    for j in journals:
        a = ks.assignments(j)
        if len(a) != want or sum(x.slot == 0 for x in a) != 1 or not is_consistent(a):
            return False
        if any(x.member not in live for x in a):
            return False
        if len({x.member.zone for x in a}) < min(2, len(zones), want):
            return False
    loads = Counter(a.member for j in journals for a in ks.assignments(j))
    counts = [loads.get(p, 0) for p in live]
    return max(counts) - min(counts) <= 1


# -- in-process: election -----------------------------------------------------------------

async def first_elected(allocs: list[Allocator]) -> None:
    waits = [asyncio.create_task(a.elected.wait()) for a in allocs]
    try:
        async with asyncio.timeout(10):
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def test_exactly_one_leader_and_failover_of_leadership(client: aetcd.Client,
                                                             etcd_root: str) -> None:
    pids = [ProcessId("a", f"broker-{i}") for i in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        ks = await stack.enter_async_context(KeySpace(client, etcd_root))
        allocs, tasks, memberships = [], [], []
        for p in pids:
            m = await stack.enter_async_context(Membership(client, etcd_root, BrokerSpec(id=p), ttl=5))
            memberships.append(m)
        # Each allocator has its own mirror, as each process would.
        for p in pids:
            own = await stack.enter_async_context(KeySpace(client, etcd_root))
            a = Allocator(client, own, p, etcd_root)
            allocs.append(a)
            tasks.append(asyncio.create_task(a.run()))
        try:
            await first_elected(allocs)
            first = next(a.me for a in allocs if a.elected.is_set())
            await wait_until(ks, lambda: ks.leader is not None, 10, "a leader")
            assert ks.leader.member == first
            for a in allocs:  # is_leader also needs the allocator's own mirror to show it
                await a.keyspace.wait_for_revision(ks.revision, 5)
            assert sum(a.is_leader for a in allocs) == 1
            # The leader dies: its lease goes, and with it the leader key.
            i = pids.index(first)
            tasks[i].cancel()
            await memberships[i].__aexit__(None, None, None)
            survivors = [a for a in allocs if a.me != first]
            await first_elected(survivors)
            await wait_until(ks, lambda: ks.leader is not None and ks.leader.member != first,
                             10, "a new leader")
            for a in survivors:
                await a.keyspace.wait_for_revision(ks.revision, 5)
            assert sum(a.is_leader for a in survivors) == 1
            assert sum(a.elected.is_set() for a in survivors) == 1
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# -- member processes ---------------------------------------------------------------------

async def start(*ms: Member) -> None:
    await asyncio.gather(*(asyncio.to_thread(m.start) for m in ms))


async def test_member_at_its_limit_gets_no_more(client: aetcd.Client, etcd_root: str,
                                                members: Callable[..., Member]) -> None:
    journals = await add_journals(client, etcd_root, 6, replication=2)
    small, big = members("a", "member-1", limit=2), members("a", "member-2", limit=100)
    async with KeySpace(client, etcd_root) as ks:
        await start(small, big)
        small_id, big_id = ProcessId("a", "member-1"), ProcessId("a", "member-2")

        def settled() -> bool:
            # 6 journals x 2 replicas need 12 slots; small offers 2, so 4 journals run
            # on big alone rather than push small past its limit.
            return (all(is_consistent(ks.assignments(j)) for j in journals)
                    and len(ks.assignments_of(big_id)) == 6
                    and len(ks.assignments_of(small_id)) == 2)
        await wait_until(ks, settled, 30, "placement")
        # More journals: the full member still gets none of them.
        more = [f"logs/more-{i}" for i in range(3)]
        await apply_specs(client, etcd_root, [ApplyChange(upsert=JournalSpec(name=n, replication=2))
                                              for n in more])
        await wait_until(ks, lambda: all(ks.assignments(j) for j in more)
                         and all(is_consistent(ks.assignments(j)) for j in more), 30)
        assert len(ks.assignments_of(small_id)) == 2
        assert all([a.member for a in ks.assignments(j)] == [big_id] for j in more)


async def test_grow_kill_and_rolling_restart(client: aetcd.Client, etcd_root: str,
                                             members: Callable[..., Member]) -> None:
    R = 3
    journals = await add_journals(client, etcd_root, 12, replication=R)
    zones = ["a", "b", "a", "b", "c"]
    ms = [members(z, f"member-{i}", ttl=TTL) for i, z in enumerate(zones)]
    floor: dict[str, int] = {}  # lowest count of synced replicas seen, once first fully placed

    async with KeySpace(client, etcd_root) as ks:
        def watch_floor(k: KeySpace) -> None:
            for j in journals:
                synced = sum(a.value is not None for a in k.assignments(j))
                if j in floor:
                    floor[j] = min(floor[j], synced)
                elif synced >= R:
                    floor[j] = synced

        # 1 -> 3 -> 5 members, each stage fully placed, consistent and balanced.
        for stage in (ms[:1], ms[1:3], ms[3:]):
            t = time.monotonic()
            await start(*stage)
            print(f"stage started in {time.monotonic() - t:.2f}s")
            try:
                await wait_until(ks, lambda: placement_ok(ks, journals, R), 45, "placement")
            except AssertionError:
                raise AssertionError(describe(ks, journals)) from None
        ks.on_change.append(watch_floor)
        watch_floor(ks)

        # kill -9 of a member that leads journals: its assignments move, primaries first.
        victim = max(ms, key=lambda m: sum(a.slot == 0 for a in ks.assignments_of(ProcessId(m.zone, m.suffix))))
        vid = ProcessId(victim.zone, victim.suffix)
        led = [a.journal for a in ks.assignments_of(vid) if a.slot == 0]
        assert led
        t0 = time.monotonic()
        await asyncio.to_thread(victim.kill)

        def new_primaries() -> bool:
            return all(any(a.slot == 0 and a.member != vid for a in ks.assignments(j)) for j in led)
        await wait_until(ks, new_primaries, TTL + 10, "new primaries")
        failover = time.monotonic() - t0
        await wait_until(ks, lambda: placement_ok(ks, journals, R), 45, "re-placement")
        replaced = time.monotonic() - t0
        print(f"\nfailover: ttl={TTL}s new-primary={failover:.2f}s fully-replaced={replaced:.2f}s "
              f"journals-led={len(led)}")
        assert failover < TTL + 5
        floor.clear()
        watch_floor(ks)

        # The killed member comes back, then a rolling restart of all five, one at a time.
        await start(victim)
        await wait_until(ks, lambda: placement_ok(ks, journals, R), 45, "victim back")
        for m in ms:
            t = time.monotonic()
            await asyncio.to_thread(m.stop)  # SIGTERM: exiting -> drained -> lease revoked
            t_stop = time.monotonic() - t
            await wait_until(ks, lambda: ProcessId(m.zone, m.suffix) not in ks.members, 10)
            await start(m)
            t_start = time.monotonic() - t
            await wait_until(ks, lambda: placement_ok(ks, journals, R), 45, f"{m.name} back")
            print(f"restart {m.name}: stopped {t_stop:.2f}s started {t_start:.2f}s "
                  f"placed {time.monotonic() - t:.2f}s")
        assert min(floor.values()) >= R - 1, floor


async def test_idle_leader_plans_only_after_a_change(client: aetcd.Client, etcd_root: str) -> None:
    """A settled leader's idle checks compare a revision; they do not re-plan (a full plan
    over 10,000 journals every 5 s was 10-13 % of an idle leader's core). A change plans."""
    pids = [ProcessId(z, f"broker-{z}") for z in "abc"]
    async with contextlib.AsyncExitStack() as stack:
        ks = await stack.enter_async_context(KeySpace(client, etcd_root))
        for p in pids:
            await stack.enter_async_context(Membership(client, etcd_root, BrokerSpec(id=p), ttl=5))
        alloc = Allocator(client, ks, pids[0], etcd_root, debounce=0.01, idle_check=0.02)
        task = asyncio.create_task(alloc.run())
        try:
            journals = await add_journals(client, etcd_root, 4, replication=2)
            await wait_until(ks, lambda: all(len(ks.assignments(j)) == 2 for j in journals),
                             20, "every journal assigned")
            deadline = time.monotonic() + 20
            while not alloc.settled:  # its next pass plans nothing (no keyspace event says so)
                assert time.monotonic() < deadline, "the leader never settled"
                await asyncio.sleep(0.02)
            plans, checks = alloc.plans, alloc.checks
            while alloc.checks < checks + 25:  # 25 idle checks, bounded
                assert time.monotonic() < deadline, "the allocator loop stopped checking"
                await asyncio.sleep(0.02)
            assert alloc.plans == plans, "an idle leader re-planned an unchanged mirror"
            await apply_specs(client, etcd_root, [ApplyChange(
                upsert=JournalSpec(name="logs/late", replication=2))])
            await wait_until(ks, lambda: len(ks.assignments("logs/late")) == 2, 20,
                             "the new journal assigned")
            assert alloc.plans > plans
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def test_a_pass_packs_transactions_within_etcds_limits() -> None:
    """Compares and operations are counted apart (etcd limits each to 128) and an
    assignee's member key is compared once per transaction: new journals of R=3 pack
    ~30 to a transaction (15 when every add carried its own member compare)."""
    from topology import allocator_plan as ap
    from topology.allocator import MAX_TXN_OPS, View
    from topology.keyspace import JournalEntry, MemberEntry

    pids = [ProcessId(z, f"broker-{z}") for z in "abcde"]
    members = {p: MemberEntry(BrokerSpec(id=p), 5, 5, 7) for p in pids}
    journals = {f"logs/{i:04d}": JournalEntry(JournalSpec(name=f"logs/{i:04d}", replication=3),
                                              9, 9) for i in range(600)}
    view = View(journals, members, {})
    changes: list[ap.Change] = [ap.Add(j, pids[(i + k) % 5], k)
                                for i, j in enumerate(journals) for k in range(3)]
    alloc = Allocator(None, None, pids[0], "/root")  # type: ignore[arg-type]
    alloc._leader_create_revision = 3
    batches = alloc._batches(view, changes)
    seen: list[str] = []
    for batch in batches:
        assert len(alloc._guards(view, batch)) <= MAX_TXN_OPS
        assert len(alloc._ops(view, batch)) <= MAX_TXN_OPS
        names = sorted({c.journal for c in batch})
        assert all(sum(c.journal == n for c in batch) == 3 for n in names)  # never split
        seen += names
    assert sorted(seen) == sorted(journals)
    assert len(batches) <= 600 // 25


def test_journals_that_get_a_primary_go_first_in_transactions_of_their_own() -> None:
    """After a member dies its journals' primaries re-advertise their routes (a revision
    each) while the leader plans; a transaction mixing a journal being re-advertised
    with one that lost its primary failed as stale, and the promotion waited a pass.
    Promotions (and a journal's first primary) are packed apart, and sent first."""
    from topology import allocator_plan as ap
    from topology.allocator import View
    from topology.keyspace import JournalEntry, MemberEntry

    pids = [ProcessId(z, f"broker-{z}") for z in "abcd"]
    members = {p: MemberEntry(BrokerSpec(id=p), 5, 5, 7) for p in pids}
    names = [f"logs/{i:04d}" for i in range(300)]
    journals = {n: JournalEntry(JournalSpec(name=n, replication=3), 9, 9) for n in names}
    view = View(journals, members, {})
    led = set(names[1::3])  # lost their primary: a promotion and an add each
    changes: list[ap.Change] = []
    for i, n in enumerate(names):
        if n in led:
            changes += [ap.ChangeSlot(n, pids[i % 4], 1, 0), ap.Add(n, pids[(i + 1) % 4], 3)]
        else:  # lost a replica: an add only (its primary re-advertises meanwhile)
            changes.append(ap.Add(n, pids[(i + 2) % 4], 3))
    alloc = Allocator(None, None, pids[0], "/root")  # type: ignore[arg-type]
    alloc._leader_create_revision = 3
    batches = alloc._batches(view, changes)
    kinds = [{c.journal in led for c in b} for b in batches]
    assert all(len(k) == 1 for k in kinds), "a transaction mixed promotions with other changes"
    firsts = [k == {True} for k in kinds]
    assert firsts == sorted(firsts, reverse=True), "promotions are not sent first"
    assert sorted(c.journal for b in batches for c in b if c.journal in led) == \
        sorted(c.journal for c in changes if c.journal in led)
