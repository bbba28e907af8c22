"""Allocator: leader election and the etcd adapter around the pure planner.

Election: `<root>/allocator/leader` is created only if absent, holding our ProcessId under
our *member* lease. Exactly one key can exist, so there is exactly one leader; when the
leader dies its lease expires, the key vanishes with its member key and assignments, and
every other member's KeySpace sees the deletion and races to create it again.

Leading: on each keyspace change (debounced, so a burst of events costs one pass) the
leader snapshots the KeySpace, plans (on a worker thread: the planner is pure CPU), and
applies the changes in transactions of at most MAX_TXN_OPS operations, then pauses at
least as long as the pass took, so a stream of changes (thousands of journals advertising
routes) costs the leader's event loop at most about half its time.

Idle is event-driven: a plan is a pure function of the mirror, so a pass whose plan was
empty records the mirror's `changed_revision`, and no pass plans again until the mirror
has changed (journals, members, assignments or the leader key). The periodic check only
compares that revision (a full plan over 10,000 journals is ~0.5 s of CPU: every 5 s it
was 10-13 % of a core on an idle leader). A pass that planned changes and could not
apply them all (an etcd error) is retried at the next check, from the same mirror. Each transaction
carries a journal's changes whole and compares, against the mirror the plan was made from:
the leader key is still ours; the journal spec is unchanged (or still absent, to drop a
deleted journal's assignments); every assignment of the journal is at the revision the
plan saw (the consistency decision depended on all of them); new keys are absent; and
an assignee's member key is unchanged. New and moved assignments are written under the
ASSIGNEE's lease, so they vanish when that member dies. A failed compare is not an error:
the plan was stale, and the next pass plans again from a newer mirror.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aetcd
import msgspec
import structlog

from protocol import ProcessId
from protocol.apply_chunks import MAX_TXN_OPS  # etcd's default, for compares and operations
from protocol.errors import EtcdLimitExceeded

from . import allocator_plan as ap
from .assignments import is_consistent
from .etcd import (
    EtcdError,
    NotLeader,
    assignment_key,
    cmp_create,
    cmp_mod,
    cmp_value,
    cmp_version,
    delete_op,
    journal_key,
    leader_key,
    member_key,
    put_op,
    txn,
)
from .keyspace import Assignment, KeySpace

__all__ = ["Allocator", "snapshot"]

log = structlog.get_logger()

EMPTY_ROUTE = b"{}"
TXN_CONCURRENCY = 8
"""Transactions of one pass in flight at once."""


@dataclass(frozen=True, slots=True)
class View:
    """The mirror as one pass saw it: the plan is made from it, and every transaction
    of the pass is guarded by its revisions (not by the live mirror, which moves while
    the pass awaits etcd), so a change the plan did not see fails its transaction."""

    journals: dict[str, Any]
    members: dict[ProcessId, Any]
    assign: dict[str, list[Assignment]]

    def assignments(self, journal: str) -> list[Assignment]:
        return self.assign.get(journal, [])


def view_of(keyspace: KeySpace) -> View:
    assign: dict[str, list[Assignment]] = {}
    for a in keyspace.all_assignments():
        assign.setdefault(a.journal, []).append(a)
    return View(dict(keyspace.journals), dict(keyspace.members), assign)


def snapshot(keyspace: KeySpace | View) -> ap.AllocState:
    """The planner's view of the mirror."""
    view = keyspace if isinstance(keyspace, View) else view_of(keyspace)
    journals = {name: ap.JournalState(name, e.spec.desired_replication())
                for name, e in view.journals.items()}
    members = {pid: ap.MemberState(pid, e.spec.journal_limit, e.spec.exiting)
               for pid, e in view.members.items()}
    assignments = tuple(ap.AssignState(a.journal, a.member, a.slot, synced=a.value is not None,
                                       mod_revision=a.mod_revision)
                        for items in view.assign.values() for a in items)
    consistent = frozenset(j for j, items in view.assign.items() if is_consistent(items))
    return ap.AllocState(journals, members, assignments, consistent)


class Allocator:
    def __init__(self, client: aetcd.Client, keyspace: KeySpace, me: ProcessId, root: str,
                 *, debounce: float = 0.03, idle_check: float = 5.0) -> None:
        self.client = client
        self.keyspace = keyspace
        self.me = me
        self.root = root.rstrip("/")
        self.debounce = debounce
        self.idle_check = idle_check
        self._leader_create_revision = 0
        self.elected = asyncio.Event()
        """Set once this allocator has won (or adopted) the leader key."""
        self.passes = 0
        """Completed leader passes that applied changes (for tests and metrics)."""
        self.checks = 0
        """Loop iterations (a change or an idle check woke the loop): for tests."""
        self.plans = 0
        """Plans made (each a full pass over the mirror: for tests and metrics)."""
        self._settled_revision: int | None = None
        """The mirror's `changed_revision` whose plan had nothing to do, if still current."""

    @property
    def is_leader(self) -> bool:
        leader = self.keyspace.leader
        return (self._leader_create_revision > 0 and leader is not None
                and leader.member == self.me and leader.create_revision == self._leader_create_revision)

    async def run(self) -> None:
        """Run until cancelled. Cancel-safe: a cancelled pass leaves etcd consistent,
        because each transaction is atomic and the next leader replans from scratch."""
        while True:
            seen = self.keyspace.changed_revision
            started = asyncio.get_running_loop().time()
            try:
                if await self._elect() and not self.settled:
                    await self.step()
            except asyncio.CancelledError:
                raise
            except (EtcdError, NotLeader) as exc:
                log.warning("allocator pass failed", member=str(self.me), error=str(exc))
            except Exception:  # noqa: BLE001 - a bug in one pass must not kill the member
                log.exception("allocator pass crashed", member=str(self.me))
            # A bounded wait: if a change arrived while we were busy we loop at once; the
            # idle check covers a lost wake-up and retries a pass whose changes etcd
            # refused (it costs a revision compare when the last plan was empty).
            elapsed = asyncio.get_running_loop().time() - started
            self.checks += 1
            await self.keyspace.wait_changed(seen, timeout=self.idle_check)
            await asyncio.sleep(max(self.debounce, min(elapsed, 2.0)))

    @property
    def settled(self) -> bool:
        """Whether the last plan, made from the mirror as it still is, had nothing to do."""
        return self._settled_revision == self.keyspace.changed_revision

    async def _elect(self) -> bool:
        if self.is_leader:
            return True
        leader = self.keyspace.leader
        me_entry = self.keyspace.members.get(self.me)
        if me_entry is None:
            return False  # not announced yet (or our lease is gone): we cannot hold the key
        if leader is not None:
            if leader.member == self.me and leader.lease == me_entry.lease:
                # Ours from before (this task restarted): adopt it.
                self._leader_create_revision = leader.create_revision
                self.elected.set()
                return True
            return False
        key = leader_key(self.root)
        result = await txn(self.client, [cmp_version(key, 0)],
                           [put_op(key, str(self.me).encode(), me_entry.lease)])
        if not result.succeeded:
            return False
        self._leader_create_revision = result.revision
        self.elected.set()
        await self.keyspace.wait_for_revision(result.revision, timeout=5.0)
        log.info("allocator leader elected", member=str(self.me), revision=result.revision)
        return True

    async def step(self) -> int:
        """One leader pass: snapshot, plan, apply. Returns the number of changes applied."""
        ks = self.keyspace
        seen = ks.changed_revision
        view = view_of(ks)
        state = snapshot(view)
        self._settled_revision = None
        # Planning is pure CPU (tens of ms per thousand journals): off the event loop, so
        # this member's lease refreshes and pipelines are not held up behind it.
        changes = await asyncio.to_thread(ap.plan, state)
        self.plans += 1
        if not changes:
            self._settled_revision = seen
            return 0
        applied, last_revision = 0, 0
        gate = asyncio.Semaphore(TXN_CONCURRENCY)

        async def run_batch(batch: list[ap.Change]) -> None:
            nonlocal applied, last_revision
            compares, ops = self._guards(view, batch), self._ops(view, batch)
            async with gate:
                try:
                    result = await txn(self.client, compares, ops)
                except EtcdError as exc:
                    # Typically an assignee's lease expired under us; the mirror will show it.
                    log.info("allocator txn refused", error=str(exc), changes=len(batch))
                    return
                except EtcdLimitExceeded as exc:
                    # An etcd whose --max-txn-ops is below 128: say so, plainly, every pass.
                    log.error("allocator txn over etcd's limits", error=str(exc),
                              changes=len(batch))
                    return
            last_revision = max(last_revision, result.revision)
            if not result.succeeded:
                log.debug("allocator txn stale", revision=result.revision, changes=len(batch))
                return
            applied += len(batch)

        # Transactions of a pass touch disjoint journals, and the plan already counted
        # every add against its assignee's limit: their order does not matter, so a few
        # run at once (thousands of journals assigned one round trip after another took
        # seconds per pass).
        await asyncio.gather(*(run_batch(b) for b in self._batches(view, changes)))
        if last_revision:
            # Read our own writes before the next pass, or we would plan from stale state.
            await ks.wait_for_revision(last_revision, timeout=5.0)
        if applied:
            self.passes += 1
            log.info("allocator applied changes", member=str(self.me), changes=applied,
                     revision=last_revision)
        return applied

    # -- building transactions -----------------------------------------------------------

    def _batches(self, view: View, changes: list[ap.Change]) -> list[list[ap.Change]]:
        """Changes grouped per journal (never split), packed into transactions within
        etcd's limit on compares and on operations (counted apart, as etcd does; an
        assignee's member key is compared once per transaction, not once per add)."""
        groups: dict[str, list[ap.Change]] = {}
        for c in changes:
            groups.setdefault(c.journal, []).append(c)
        batches: list[list[ap.Change]] = []
        current: list[ap.Change] = []
        compares, ops, guarded = 2, 0, set()  # 2: the leader key's value and creation
        promoting = {j for j, g in groups.items() if any(_promotes(c) for c in g)}
        was_promoting = True
        # Journals that get a primary first, in transactions of their own: nobody else
        # writes their keys (they have no primary to advertise a route), while the rest
        # of a member's journals are being re-advertised by their primaries right after
        # it died — mixed in, one advertisement failed a whole transaction as stale and
        # its promotions waited a pass (new primaries 19 s after the lease expired at
        # 10,000 journals: the first two passes applied 3 and 5 transactions of ~60).
        for journal in sorted(groups, key=lambda j: (j not in promoting, j)):
            group = groups[journal]
            if current and was_promoting and journal not in promoting:
                batches.append(current)
                current, compares, ops, guarded = [], 2, 0, set()
            was_promoting = journal in promoting
            placing = [c for c in group if isinstance(c, (ap.Add, ap.ChangeSlot))]
            g_compares = 1 + len(view.assignments(journal)) + len(placing)
            g_members = {c.member for c in placing}
            g_ops = sum(2 if isinstance(c, ap.ChangeSlot) else 1 for c in group)
            if current and (compares + g_compares + len(g_members - guarded) > MAX_TXN_OPS
                            or ops + g_ops > MAX_TXN_OPS):
                batches.append(current)
                current, compares, ops, guarded = [], 2, 0, set()
            current.extend(group)
            compares += g_compares + len(g_members - guarded)
            ops += g_ops
            guarded |= g_members
        if current:
            batches.append(current)
        return batches

    def _guards(self, ks: View, batch: list[ap.Change]) -> list[Any]:
        compares = [cmp_value(leader_key(self.root), str(self.me).encode()),
                    cmp_create(leader_key(self.root), self._leader_create_revision)]
        for journal in sorted({c.journal for c in batch}):
            entry = ks.journals.get(journal)
            if entry is None:
                compares.append(cmp_version(journal_key(self.root, journal), 0))
            else:
                compares.append(cmp_mod(journal_key(self.root, journal), entry.mod_revision))
            for a in ks.assignments(journal):
                compares.append(cmp_mod(self._key(a.journal, a.member, a.slot), a.mod_revision))
        guarded: set[ProcessId] = set()
        for c in batch:
            if isinstance(c, ap.Add):
                compares.append(cmp_version(self._key(c.journal, c.member, c.slot), 0))
            elif isinstance(c, ap.ChangeSlot):
                compares.append(cmp_version(self._key(c.journal, c.member, c.to_slot), 0))
            if isinstance(c, (ap.Add, ap.ChangeSlot)) and c.member not in guarded:
                guarded.add(c.member)
                m = ks.members[c.member]
                compares.append(cmp_mod(member_key(self.root, c.member), m.mod_revision))
        return compares

    def _ops(self, ks: View, batch: list[ap.Change]) -> list[Any]:
        ops = []
        for c in batch:
            if isinstance(c, ap.Add):
                ops.append(put_op(self._key(c.journal, c.member, c.slot), EMPTY_ROUTE,
                                  ks.members[c.member].lease))
            elif isinstance(c, ap.Remove):
                ops.append(delete_op(self._key(c.journal, c.member, c.slot)))
            else:
                old = self._find(ks, c.journal, c.member, c.from_slot)
                value = old.value if old is not None else None
                ops.append(delete_op(self._key(c.journal, c.member, c.from_slot)))
                # The value moves with the assignment: it records that this member took
                # part in the last advertised route, which makes it a valid primary.
                encoded = msgspec.json.encode(value) if value is not None else EMPTY_ROUTE
                ops.append(put_op(self._key(c.journal, c.member, c.to_slot), encoded,
                                  ks.members[c.member].lease))
        return ops

    def _find(self, ks: View, journal: str, member: ProcessId, slot: int) -> Assignment | None:
        return next((a for a in ks.assignments(journal)
                     if a.member == member and a.slot == slot), None)

    def _key(self, journal: str, member: ProcessId, slot: int) -> str:
        return assignment_key(self.root, journal, member, slot)


def _promotes(c: ap.Change) -> bool:
    """`c` gives its journal a primary (a promotion, or a new journal's first add)."""
    return (isinstance(c, ap.ChangeSlot) and c.to_slot == 0) or (isinstance(c, ap.Add)
                                                                  and c.slot == 0)
