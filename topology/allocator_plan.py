"""Allocator planning: from a topology snapshot to the next safe set of changes. Pure.

Theory of operation
-------------------
`plan(state)` is called by the allocator leader on every keyspace change. It never does
IO: the adapter (allocator.py) snapshots the KeySpace into an `AllocState`, applies the
returned changes in guarded etcd transactions, and plans again when the mirror moves.

1. **Desired placement** (`desired_placement`) is a function of the journals, the live
   members and which members hold each journal now. Stability comes from stickiness
   and rendezvous (highest-random-weight) hashing: a journal's current members are
   ranked first, then the rest by HRW, so when a member comes or goes (or journals are
   added) only the replicas it held, and the few the balancing pass shifts, move. It
   converges: in journal-name order, a journal's placement depends only on the ones
   before it and its own members, and a journal whose members are its desired set
   keeps them (at 10,000 journals, placement from HRW alone re-placed ~3,000 untouched
   journals when one member of five died, and ~650 per thousand journals added).
   - eligible members: present, not exiting, limit > 0;
   - replicas per journal = min(desired replication, eligible members);
   - per-member quota by water-filling (as equal as limits allow);
   - greedy in journal-name order over each journal's ranking: first members of new
     zones until it spans two (spread), then any member, under quota (and, failing
     that, under limit);
   - then a balancing pass moves replicas from the most to the least loaded member
     until loads differ by at most one, never taking a journal below two zones.
2. **Transition**, per journal, in this order of safety (Gazette's allocator rules):
   - assignments of deleted journals and of members that are gone are dropped;
   - missing desired replicas are added first (over-subscription), each within the
     assignee's journal limit counted over all its current assignments;
   - undesired replicas are removed only when the journal is *consistent* (every
     assignment advertises the route built from all of them) and only while at least
     the desired number of replicas remain;
   - a journal without a primary gets one by promoting (slot -> 0) a member that took
     part in the last advertised route, preferring desired members and few primaries; a
     brand-new journal gets its primary at its first add. Removing a primary promotes
     its successor in the same transaction so there is no primary-less window.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol import ProcessId

__all__ = [
    "Add",
    "AllocState",
    "AssignState",
    "Change",
    "ChangeSlot",
    "JournalState",
    "MemberState",
    "Promote",
    "Remove",
    "apply_changes",
    "desired_placement",
    "plan",
    "score",
]


# -- snapshot -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MemberState:
    id: ProcessId
    limit: int
    exiting: bool = False

    @property
    def zone(self) -> str:
        return self.id.zone


@dataclass(frozen=True, slots=True)
class JournalState:
    name: str
    replication: int
    """Desired replication (after suspension)."""


@dataclass(frozen=True, slots=True)
class AssignState:
    journal: str
    member: ProcessId
    slot: int
    synced: bool = False
    """The value holds an advertised route: this member took part in the last sync."""
    mod_revision: int = 0


@dataclass(frozen=True)
class AllocState:
    journals: dict[str, JournalState]
    members: dict[ProcessId, MemberState]
    assignments: tuple[AssignState, ...]
    consistent: frozenset[str] = frozenset()
    """Journals whose every assignment advertises the route built from all of them."""


# -- changes ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Add:
    journal: str
    member: ProcessId
    slot: int


@dataclass(frozen=True, slots=True)
class Remove:
    journal: str
    member: ProcessId
    slot: int


@dataclass(frozen=True, slots=True)
class ChangeSlot:
    """Move an assignment to another slot (to 0: a promotion); keeps its value."""

    journal: str
    member: ProcessId
    from_slot: int
    to_slot: int


Promote = ChangeSlot
Change = Add | Remove | ChangeSlot


# -- desired placement --------------------------------------------------------------------

def score(journal: str, member: ProcessId) -> int:
    """Rendezvous weight: stable across processes and Python versions (no hash())."""
    digest = hashlib.blake2b(f"{journal}\0{member.zone}\0{member.suffix}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _quotas(members: list[MemberState], demand: int) -> dict[ProcessId, int]:
    """Water-fill `demand` over members: the lowest level L with sum(min(limit, L)) >= demand."""
    if not members:
        return {}
    lo, hi = 0, max(m.limit for m in members)
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(min(m.limit, mid) for m in members) >= demand:
            hi = mid
        else:
            lo = mid + 1
    return {m.id: min(m.limit, lo) for m in members}


def desired_placement(journals: dict[str, JournalState],
                      members: dict[ProcessId, MemberState],
                      current: dict[str, set[ProcessId]] | None = None,
                      ) -> dict[str, list[ProcessId]]:
    """journal -> desired members, ranked (best primary candidate first).

    `current` (journal -> the members assigned it now) makes the placement sticky: a
    journal's current members are tried before the rest of its ranking, so a change of
    members or journals moves only what it must (and what balancing then moves). Without
    it, the greedy fill under new quotas re-placed thousands of untouched journals after
    one member of five died at 10,000 journals (2,992 over-subscribed at once)."""
    current = current or {}
    eligible = sorted((m for m in members.values() if not m.exiting and m.limit > 0),
                      key=lambda m: m.id)
    want = {j.name: min(max(j.replication, 0), len(eligible)) for j in journals.values()}
    quota = _quotas(eligible, sum(want.values()))
    limit = {m.id: m.limit for m in eligible}
    load = {m.id: 0 for m in eligible}
    placed: dict[str, list[ProcessId]] = {}
    scores: dict[str, dict[ProcessId, int]] = {}
    """Every (journal, member) weight, computed once: the balancing pass reads them often."""
    for name in sorted(journals):
        weights = scores[name] = {m.id: score(name, m.id) for m in eligible}
        now = current.get(name, set())
        ranked = sorted(eligible, key=lambda m: (m.id in now, weights[m.id]), reverse=True)
        chosen: list[ProcessId] = []
        # Zone spread beats balance (as in Gazette: two zones unless forced into one), and
        # quotas beat limits: each pass only fills what the stricter ones could not.
        for cap, spread in ((quota, True), (limit, True), (quota, False), (limit, False)):
            zones = {p.zone for p in chosen}
            if cap is limit and spread and len(zones) >= 2:
                continue
            for m in ranked:
                # Spread passes place members of new zones until there are two (Gazette:
                # two zones survive a zone's loss; wider spread is not worth a move).
                if len(chosen) >= want[name] or (spread and len(zones) >= 2):
                    break
                if m.id in chosen or load[m.id] >= cap[m.id] or (spread and m.zone in zones):
                    continue
                chosen.append(m.id)
                zones.add(m.zone)
                load[m.id] += 1
        placed[name] = chosen
    _balance(placed, load, limit, scores)
    for name, chosen in placed.items():
        weights = scores[name]
        chosen.sort(key=lambda p: weights[p], reverse=True)
    return placed


def _balance(placed: dict[str, list[ProcessId]], load: dict[ProcessId, int],
             limit: dict[ProcessId, int], scores: dict[str, dict[ProcessId, int]]) -> None:
    """Move replicas from most to least loaded members until loads differ by <= 1."""
    holding: dict[ProcessId, set[str]] = {p: set() for p in load}
    """member -> the journals placed on it (kept as moves happen: each move scans only
    the journals of the member it unloads, not every journal)."""
    for name, chosen in placed.items():
        for p in chosen:
            holding[p].add(name)
    stuck: set[tuple[ProcessId, ProcessId]] = set()
    """(hi, lo) pairs without any journal to move: a move changes one journal only, so a
    pair stays stuck unless that journal became movable for it (zones can pin every
    replica of a member, e.g. the only member of a zone: scanning it on every move made
    the pass quadratic)."""
    for _ in range(sum(load.values()) + 1):  # each move lowers the spread; bounded anyway
        by_load = sorted(load, key=lambda p: (load[p], p))
        move = None
        for hi in reversed(by_load):
            for lo in by_load:
                if load[hi] - load[lo] < 2:
                    break
                if load[lo] >= limit[lo] or (hi, lo) in stuck:
                    continue
                move = _best_move(placed, holding[hi], hi, lo, scores)
                if move is not None:
                    break
                stuck.add((hi, lo))
            if move is not None:
                break
        if move is None:
            return
        name, hi, lo = move
        placed[name][placed[name].index(hi)] = lo
        holding[hi].discard(name)
        holding[lo].add(name)
        load[hi] -= 1
        load[lo] += 1
        stuck = {pair for pair in stuck if not _movable(placed[name], *pair)}


def _movable(chosen: list[ProcessId], hi: ProcessId, lo: ProcessId) -> bool:
    """Whether a journal placed on `chosen` may move its replica from `hi` to `lo`."""
    if hi not in chosen or lo in chosen:
        return False
    before = len({p.zone for p in chosen})
    after = len({p.zone for p in chosen if p != hi} | {lo.zone})
    # Two zones survive any single-zone outage; spreading wider than that is only worth
    # it while it costs no balance (a lone member in a third zone would otherwise have
    # to hold every journal).
    return after >= min(before, 2)


def _best_move(placed: dict[str, list[ProcessId]], names: set[str], hi: ProcessId,
               lo: ProcessId, scores: dict[str, dict[ProcessId, int]],
               ) -> tuple[str, ProcessId, ProcessId] | None:
    """The journal of `names` (those placed on `hi`) best moved to `lo`: the highest
    gain, the first name among equal gains."""
    best: tuple[int, str] | None = None
    for name in names:
        # Prefer the journal that ranks `lo` highest relative to `hi`: the move then
        # agrees with what rendezvous hashing would choose without quotas. (The gain is
        # checked first: it is cheap, and it rules out nearly every journal.)
        weights = scores[name]
        gain = weights[lo] - weights[hi]
        if best is not None and (gain < best[0] or (gain == best[0] and name > best[1])):
            continue
        if _movable(placed[name], hi, lo):
            best = (gain, name)
    return None if best is None else (best[1], hi, lo)


# -- transition ---------------------------------------------------------------------------

@dataclass
class _Tally:
    """Running per-member counts as changes are planned (limits are hard)."""

    load: dict[ProcessId, int] = field(default_factory=dict)
    primaries: dict[ProcessId, int] = field(default_factory=dict)


def plan(state: AllocState) -> list[Change]:
    by_journal: dict[str, list[AssignState]] = {}
    for a in state.assignments:
        by_journal.setdefault(a.journal, []).append(a)
    desired = desired_placement(state.journals, state.members,
                                {j: {a.member for a in items} for j, items in by_journal.items()})
    tally = _Tally()
    for a in state.assignments:
        tally.load[a.member] = tally.load.get(a.member, 0) + 1
        if a.slot == 0:
            tally.primaries[a.member] = tally.primaries.get(a.member, 0) + 1
    eligible = sum(1 for m in state.members.values() if not m.exiting and m.limit > 0)
    changes: list[Change] = []
    for name in sorted(set(by_journal) | set(state.journals)):
        spec = state.journals.get(name)
        floor = min(spec.replication, eligible) if spec is not None else 0
        changes.extend(_plan_journal(state, name, by_journal.get(name, []),
                                     desired.get(name, []), floor, tally))
    return changes


def _plan_journal(state: AllocState, name: str, current: list[AssignState],
                  desired: list[ProcessId], floor: int, tally: _Tally) -> list[Change]:
    """Changes for one journal; `floor` is the replica count removals never go below."""
    out: list[Change] = []
    spec = state.journals.get(name)
    live: list[AssignState] = []
    seen: set[ProcessId] = set()
    for a in sorted(current, key=lambda a: (a.slot, a.member)):
        # Deleted journals and departed members lose their assignments unconditionally:
        # there is nothing left to protect. A member assigned twice keeps its lowest slot.
        if spec is None or a.member not in state.members or a.member in seen:
            out.append(Remove(name, a.member, a.slot))
            continue
        seen.add(a.member)
        live.append(a)
    if spec is None:
        return out
    members = {a.member: a for a in live}
    used_slots = {a.slot for a in live}
    primary = next((a for a in live if a.slot == 0), None)

    # Adds first. A journal with no replicas at all gets its primary with its first adds,
    # on the desired member holding the fewest primaries (spreads the append work).
    addable = [p for p in desired
               if p not in members and tally.load.get(p, 0) < state.members[p].limit]
    first_primary = None
    if not live and addable:
        first_primary = min(addable, key=lambda p: (tally.primaries.get(p, 0), -score(name, p)))
    for pid in addable:
        slot = 0 if pid == first_primary else _free_slot(used_slots)
        used_slots.add(slot)
        tally.load[pid] = tally.load.get(pid, 0) + 1
        if slot == 0:
            tally.primaries[pid] = tally.primaries.get(pid, 0) + 1
            primary = AssignState(name, pid, 0)
        out.append(Add(name, pid, slot))

    # Promotion when the primary is missing, from members of the last advertised route.
    if primary is None and live:
        pick = _successor(name, live, desired, tally, exclude=None)
        if pick is not None:
            out.append(ChangeSlot(name, pick.member, pick.slot, 0))
            tally.primaries[pick.member] = tally.primaries.get(pick.member, 0) + 1
            return out  # the route changed: removals wait for it to be advertised

    # Removals: only from a consistent route, and never below the desired replication.
    if name not in state.consistent:
        return out
    undesired = [a for a in live if a.member not in desired]
    # Counted against the journal's replication, not the desired list: a placement cut
    # short by full members must not license a removal.
    budget = len(live) - max(floor, len(desired))
    # Exiting members first, then the most loaded: they free the scarcest capacity.
    undesired.sort(key=lambda a: (not state.members[a.member].exiting,
                                  -tally.load.get(a.member, 0), a.member))
    remaining = list(live)
    successor: AssignState | None = None
    for a in undesired:
        if budget <= 0:
            break
        if successor is not None and a.member == successor.member:
            continue  # just promoted: it stays
        if a.slot == 0:
            successor = _successor(name, [b for b in remaining if b is not a], desired, tally,
                                   exclude=a.member)
            if successor is None:
                continue  # no one to hand the primary to yet
            out.append(ChangeSlot(name, successor.member, successor.slot, 0))
            tally.primaries[successor.member] = tally.primaries.get(successor.member, 0) + 1
            tally.primaries[a.member] -= 1
        # The load is not decremented: this removal may land in a later transaction than
        # an add planned against the freed capacity, and limits are hard.
        out.append(Remove(name, a.member, a.slot))
        remaining.remove(a)
        budget -= 1
    return out


def _free_slot(used: set[int]) -> int:
    slot = 1
    while slot in used:
        slot += 1
    return slot


def _successor(name: str, live: list[AssignState], desired: list[ProcessId], tally: _Tally,
               exclude: ProcessId | None) -> AssignState | None:
    """The member to promote: synced ones only, unless none is (a never-synced journal)."""
    pool = [a for a in live if a.member != exclude]
    synced = [a for a in pool if a.synced]
    if synced:
        pool = synced
    elif any(a.synced for a in live):
        return None  # only the outgoing primary is synced: wait for the next advertisement
    if not pool:
        return None
    return min(pool, key=lambda a: (a.member not in desired, tally.primaries.get(a.member, 0),
                                    -score(name, a.member)))


# -- simulation helper (used by tests and by the adapter's dry runs) ----------------------

def apply_changes(assignments: Iterable[AssignState], changes: Iterable[Change]) -> list[AssignState]:
    """The assignments after `changes` (new and moved assignments are not synced, except
    that a slot change keeps its value, as the adapter does)."""
    current = {(a.journal, a.member, a.slot): a for a in assignments}
    for c in changes:
        if isinstance(c, Add):
            current[(c.journal, c.member, c.slot)] = AssignState(c.journal, c.member, c.slot)
        elif isinstance(c, Remove):
            current.pop((c.journal, c.member, c.slot), None)
        else:
            old = current.pop((c.journal, c.member, c.from_slot))
            current[(c.journal, c.member, c.to_slot)] = AssignState(
                c.journal, c.member, c.to_slot, synced=old.synced)
    return sorted(current.values(), key=lambda a: (a.journal, a.slot, a.member))
