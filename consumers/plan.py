"""Pure decisions of a consumer member: which shards to lead or stand by for, and when
a primary commits. No IO, no asyncio: member.py and runner.py drive these.

Placement reuses the journal allocator's planner (`desired_placement`: zone-aware
rendezvous hashing with balanced quotas): each enabled shard is a "journal" of
replication 1 + hot_standbys over the live consumer members; the first member of its
ranking is the desired primary, the rest its standbys. Exclusivity does not depend on
every member agreeing on that ranking: a primary must hold the shard's etcd lock (a key
created only if absent, under its lease), so at most one exists at any time.

Per shard, a member's actions (`plan_member`):
- it holds the lock and is no longer the desired primary (or the shard was deleted or
  disabled): RELEASE (commit, stop, delete the lock);
- it is the desired primary, no one holds the lock, and it does not run it: ACQUIRE;
- it is a desired standby and not primary: STANDBY (tail the recovery log);
- it runs a standby it no longer should: STOP_STANDBY.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from protocol import ProcessId
from protocol.shard import ShardSpec, ShardState, ShardStatus
from topology.allocator_plan import JournalState, MemberState, desired_placement

__all__ = [
    "Action",
    "CommitPolicy",
    "Lifecycle",
    "Step",
    "other_primaries",
    "placement",
    "plan_member",
]


def placement(specs: Iterable[ShardSpec], members: Iterable[MemberState]) -> dict[str, list[ProcessId]]:
    """shard id -> ranked members (primary first, then standbys)."""
    shards = {s.id: JournalState(s.id, 1 + s.hot_standbys) for s in specs if not s.disable}
    ranked = desired_placement(shards, {m.id: m for m in members})
    # The planner balances replicas; spread the primaries too: in shard order, the member
    # of each shard's set leading the fewest shards so far (ties: its ranking) leads it.
    led: dict[ProcessId, int] = {}
    for shard in sorted(ranked):
        chosen = ranked[shard]
        if not chosen:
            continue
        primary = min(chosen, key=lambda m: (led.get(m, 0), chosen.index(m)))
        led[primary] = led.get(primary, 0) + 1
        ranked[shard] = [primary, *(m for m in chosen if m != primary)]
    return ranked


class Action(str, enum.Enum):
    ACQUIRE = "acquire"
    RELEASE = "release"
    STANDBY = "standby"
    STOP_STANDBY = "stop-standby"


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    shard: str


def plan_member(me: ProcessId, specs: Mapping[str, ShardSpec], ranked: Mapping[str, list[ProcessId]],
                locks: Mapping[str, str], primaries: Iterable[str],
                standbys: Iterable[str]) -> list[Step]:
    """The steps `me` should take now. `locks`: shard -> holder ("zone#suffix");
    `primaries`/`standbys`: shards this member currently runs in each role."""
    mine = str(me)
    running = set(primaries)
    standing = set(standbys)
    steps: list[Step] = []
    for shard in sorted(running):
        spec = specs.get(shard)
        want = ranked.get(shard, [])
        if spec is None or spec.disable or not want or want[0] != me:
            steps.append(Step(Action.RELEASE, shard))
    for shard, want in sorted(ranked.items()):
        if not want:
            continue
        if want[0] == me and shard not in running and shard not in locks:
            steps.append(Step(Action.ACQUIRE, shard))
        elif me in want[1:] and shard not in running and shard not in standing \
                and locks.get(shard) != mine:
            steps.append(Step(Action.STANDBY, shard))
    for shard in sorted(standing):
        want = ranked.get(shard, [])
        if me not in want[1:] and not (want and want[0] == me and shard not in locks):
            steps.append(Step(Action.STOP_STANDBY, shard))
    return steps


def other_primaries(me: ProcessId, shard: str, reports: Iterable[ShardStatus]) -> list[str]:
    """Members other than `me` whose status report says PRIMARY for `shard`.

    The rule the chaos checker holds members to: at every etcd revision a shard has at
    most one primary among its lock holder and its PRIMARY reporters. Two halves keep it
    without any timing: a PRIMARY report is only ever written in a transaction that
    compares its writer's own lock (so none is written once that lock is gone), and a
    lock is only ever created in a transaction that compares no status report of the
    shard changed since a view in which this function returned nothing. A report lives
    on its member's lease: its member withdraws it (retrying until it succeeds or the
    lease is gone), or the lease expires with a dead member — so a successor's wait ends
    without a timeout that could let it take the lock beside a live report."""
    mine = str(me)
    return sorted({r.member for r in reports
                   if r.id == shard and r.member != mine and r.state is ShardState.PRIMARY})


class Lifecycle:
    """A shard's state on one member (Gazette's replica status), with legal transitions.

        IDLE -> BACKFILL -> STANDBY -> BACKFILL (promoted) -> PRIMARY -> IDLE (released)
        any  -> FAILED -> IDLE (retried)
    """

    _NEXT = {
        ShardState.IDLE: {ShardState.BACKFILL, ShardState.FAILED},
        ShardState.BACKFILL: {ShardState.STANDBY, ShardState.PRIMARY, ShardState.IDLE,
                              ShardState.FAILED},
        ShardState.STANDBY: {ShardState.BACKFILL, ShardState.IDLE, ShardState.FAILED},
        ShardState.PRIMARY: {ShardState.IDLE, ShardState.FAILED},
        ShardState.FAILED: {ShardState.IDLE},
    }

    def __init__(self) -> None:
        self.state = ShardState.IDLE
        self.reason = ""

    def to(self, state: ShardState, reason: str = "") -> ShardState:
        if state is not self.state and state not in self._NEXT[self.state]:
            raise ValueError(f"illegal shard transition {self.state.value} -> {state.value}")
        self.state, self.reason = state, reason
        return state


@dataclass
class CommitPolicy:
    """When a primary commits: at a message boundary once `interval` passed since the
    transaction's first message, on a checkpoint notice, or when input pauses."""

    interval: float
    max_ops: int = 200_000
    opened: float | None = None
    """Monotonic time of the open transaction's first message (None: nothing open)."""
    notice: bool = False

    def on_message(self, now: float) -> None:
        if self.opened is None:
            self.opened = now

    def due(self, now: float, pending_ops: int, idle: bool = False) -> bool:
        if self.notice:
            return True
        if self.opened is None:
            return False
        return idle or pending_ops >= self.max_ops or now - self.opened >= self.interval

    def committed(self) -> None:
        self.opened = None
        self.notice = False

    def wait_budget(self, now: float) -> float:
        """How long the reader may block for input before a commit falls due."""
        if self.notice:
            return 0.0
        if self.opened is None:
            return self.interval
        return max(0.0, self.interval - (now - self.opened))
