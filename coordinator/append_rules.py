"""Pure decisions of the append state machine (no IO, no asyncio).

Every function here takes plain values and returns the next `State` (plus whatever the
adapter needs to act on it), so each transition of the seed's state machine can be
unit-tested directly. `TRANSITIONS` lists every edge; tests check that each one is
produced by some decision and that the FSM handles every state.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from protocol import (
    AppendRequest,
    Fragment,
    JournalSpec,
    LabelSet,
    ProcessId,
    ProducerSnapshot,
    ReplicateResponse,
    Route,
    Status,
    Suspend,
    SuspendLevel,
)
from protocol.errors import QuireError


class State(enum.Enum):
    RESOLVE = "stateResolve"
    ACQUIRE_PIPELINE = "stateAcquirePipeline"
    START_PIPELINE = "stateStartPipeline"
    SEND_PIPELINE_SYNC = "stateSendPipelineSync"
    RECV_PIPELINE_SYNC = "stateRecvPipelineSync"
    UPDATE_ASSIGNMENTS = "stateUpdateAssignments"
    AWAIT_DESIRED_REPLICAS = "stateAwaitDesiredReplicas"
    VALIDATE_PRECONDITIONS = "stateValidatePreconditions"
    STREAM_CONTENT = "stateStreamContent"
    READ_ACKNOWLEDGEMENTS = "stateReadAcknowledgements"
    ERROR = "stateError"
    PROXY = "stateProxy"
    FINISHED = "stateFinished"

    # Members are singletons compared by identity: hash them by identity too, in C,
    # instead of Enum's Python-level hash(name) (dozens of lookups per append).
    __hash__ = object.__hash__


S = State
TERMINAL = frozenset({S.ERROR, S.PROXY, S.FINISHED})

# Every edge of the seed's state machine (transitions to ERROR from blocking states
# included, as the seed says they exist but omits them).
TRANSITIONS: dict[State, frozenset[State]] = {
    S.RESOLVE: frozenset({S.AWAIT_DESIRED_REPLICAS, S.START_PIPELINE, S.ACQUIRE_PIPELINE, S.ERROR}),
    S.ACQUIRE_PIPELINE: frozenset({S.RESOLVE, S.START_PIPELINE, S.ERROR}),
    S.START_PIPELINE: frozenset({S.UPDATE_ASSIGNMENTS, S.RESOLVE, S.SEND_PIPELINE_SYNC, S.ERROR}),
    S.SEND_PIPELINE_SYNC: frozenset({S.RECV_PIPELINE_SYNC, S.ERROR}),
    S.RECV_PIPELINE_SYNC: frozenset({S.RESOLVE, S.SEND_PIPELINE_SYNC, S.UPDATE_ASSIGNMENTS, S.ERROR}),
    S.UPDATE_ASSIGNMENTS: frozenset({S.AWAIT_DESIRED_REPLICAS, S.RESOLVE, S.ERROR}),
    S.AWAIT_DESIRED_REPLICAS: frozenset({S.RESOLVE, S.ERROR, S.PROXY, S.VALIDATE_PRECONDITIONS}),
    S.VALIDATE_PRECONDITIONS: frozenset({S.RESOLVE, S.ERROR, S.STREAM_CONTENT, S.SEND_PIPELINE_SYNC}),
    S.STREAM_CONTENT: frozenset({S.STREAM_CONTENT, S.READ_ACKNOWLEDGEMENTS, S.ERROR}),
    S.READ_ACKNOWLEDGEMENTS: frozenset({S.FINISHED, S.ERROR}),
    S.ERROR: frozenset(),
    S.PROXY: frozenset(),
    S.FINISHED: frozenset(),
}


class AppendAborted(QuireError):
    """The client aborted, disconnected, timed out or was too slow."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Decision:
    state: State
    status: Status = Status.OK
    message: str = ""
    roll_to: int | None = None
    registers: LabelSet | None = None
    read_through: int = 0
    suspend: Suspend | None = None
    """A suspension to write into the spec before resolving again (resume)."""
    producers: ProducerSnapshot | None = None
    """With roll_to: the producer table of the peer rolled forward to (like registers)."""
    epoch: int = 0
    """With roll_to: the epoch of the content ending there (the roll proposal's epoch)."""
    epoch_begin: int = 0
    """With epoch: the offset at which that epoch's content begins."""
    epochs: tuple[tuple[int, int], ...] = ()
    """With epoch: the newest tail's epoch history (ReplicateProposal.epochs)."""


_PLAIN = {s: Decision(s) for s in State}
"""Shared, immutable decisions that carry nothing but the next state (the hot path)."""


def go(state: State) -> Decision:
    return _PLAIN[state]


def decide_resolve(status: Status, is_primary: bool, owns_pipeline: bool) -> Decision:
    if status != Status.OK:
        return Decision(S.ERROR, status, "resolution failed")
    if not is_primary:
        return _PLAIN[S.AWAIT_DESIRED_REPLICAS]
    if owns_pipeline:
        return _PLAIN[S.START_PIPELINE]
    return _PLAIN[S.ACQUIRE_PIPELINE]


def decide_acquired(route_still_valid: bool) -> Decision:
    return _PLAIN[S.START_PIPELINE if route_still_valid else S.RESOLVE]


def decide_start(pipeline_route: Route | None, pipeline_ok: bool, resolved: Route,
                 route_still_valid: bool = True) -> Decision:
    """Reuse a healthy pipeline of an equivalent route; otherwise (re)build and sync."""
    if not route_still_valid:
        return _PLAIN[S.RESOLVE]
    if pipeline_route is not None and pipeline_ok and pipeline_route.equivalent(resolved) \
            and pipeline_route.endpoints == resolved.endpoints:
        return _PLAIN[S.UPDATE_ASSIGNMENTS]
    return _PLAIN[S.SEND_PIPELINE_SYNC]


@dataclass(frozen=True, slots=True, eq=False)
class _Tail:
    """One member's spool at a sync: its fragment and the epoch of its content."""

    fragment: Fragment
    epoch: int
    epoch_begin: int
    epochs: tuple[tuple[int, int], ...] = ()
    registers: LabelSet | None = None
    producers: ProducerSnapshot | None = None
    """A peer's registers and table (None: ours, kept as they are)."""
    pid: str = "us"


def decide_sync(responses: Sequence[tuple[ProcessId, ReplicateResponse]], ours: Fragment,
                route: Route, revision: int, our_epoch: int = 0,
                our_epoch_begin: int = 0,
                our_epochs: tuple[tuple[int, int], ...] = ()) -> Decision:
    """Gather the sync answers (Gazette's gatherSync): epochs first, then offsets.

    Every tail is of some epoch (the revision of the route its last commit came under;
    0: unknown, e.g. a spool started after a restart). The newest epoch's content is
    what the journal acknowledged last; a tail of an older epoch reaching past the
    offset where the newest epoch begins is a stale tail — committed by a primary that
    failed mid-commit, after which the journal acknowledged other bytes at those
    offsets without that member (chaos seeds 5 and 3, docs/reliability.md). More
    precisely a tail of epoch e is stale past the offset where the first epoch after
    e begins in the newest tail's epoch history (KIP-279): content of epochs between e
    and the newest was acknowledged too (test_sync_model). Stale tails are cut there
    (ours too: the roll proposal is applied to our own spool first), then the largest
    remaining offset wins and everyone rolls to it,
    taking its registers and producer table. Without a stale tail this is Gazette's
    rule: roll forward to a peer that is ahead, never re-writing an offset it may have
    committed."""
    read_through = 0
    tails: list[_Tail] = []
    for pid, resp in responses:
        if resp.status == Status.OK:
            continue
        if resp.status == Status.WRONG_ROUTE:
            theirs = resp.header
            if theirs is not None and not theirs.route.equivalent(route) \
                    and theirs.etcd.revision > revision:
                read_through = max(read_through, theirs.etcd.revision)
                continue
            return Decision(S.ERROR, Status.WRONG_ROUTE, f"peer {pid} disagrees on the route at "
                            f"revision {theirs.etcd.revision if theirs else '?'}")
        if resp.status == Status.PROPOSAL_MISMATCH and resp.fragment is not None:
            tails.append(_Tail(resp.fragment, resp.epoch, resp.epoch_begin, resp.epochs,
                               resp.registers, resp.producers, str(pid)))
            continue
        return Decision(S.ERROR, resp.status, f"peer {pid} answered the sync with {resp.status.name}")
    if read_through:
        return Decision(S.RESOLVE, read_through=read_through)
    if not tails:
        return _PLAIN[S.UPDATE_ASSIGNMENTS]
    mine = _Tail(ours, our_epoch, our_epoch_begin, our_epochs)
    every = (mine, *tails)
    newest = max(t.epoch for t in every)
    first = min((t for t in every if t.epoch == newest), key=lambda t: t.epoch_begin)
    begin = first.epoch_begin
    history = first.epochs or ((newest, begin),)
    cut_at = {id(t): next((b for e, b in history if e > t.epoch), begin)
              for t in every if 0 < t.epoch < newest}
    stale = [t for t in every if id(t) in cut_at and t.fragment.end > cut_at[id(t)]]
    if not stale:
        for t in tails:
            peer = t.fragment
            if peer.end < ours.end or (peer.end == ours.end and peer.begin != peer.end):
                return Decision(S.ERROR, Status.PROPOSAL_MISMATCH,
                                f"peer {t.pid} has fragment {peer.begin}-{peer.end} vs ours "
                                f"{ours.begin}-{ours.end}")
    # Each tail's end once a stale one is cut; the furthest wins (ours on a tie).
    kept = [(min(t.fragment.end, cut_at[id(t)]) if t in stale else t.fragment.end, t is mine, t)
            for t in every]
    roll_to, _, winner = max(kept, key=lambda k: (k[0], k[1]))
    if winner is mine:  # ours stand (cut or not), and so do our registers and table
        return Decision(S.SEND_PIPELINE_SYNC, roll_to=roll_to, epoch=newest, epoch_begin=begin,
                        epochs=history)
    return Decision(S.SEND_PIPELINE_SYNC, roll_to=roll_to, registers=winner.registers,
                    producers=winner.producers, epoch=newest, epoch_begin=begin,
                    epochs=history)


def decide_assignments(values: Sequence[Route | None], route: Route) -> Decision:
    """RESOLVE after advertising the route when any assignment value differs."""
    # Same as comparing without endpoints (a Route is members, primary and endpoints).
    if all(v is not None and v.equivalent(route) for v in values):
        return _PLAIN[S.AWAIT_DESIRED_REPLICAS]
    return _PLAIN[S.RESOLVE]


def decide_replicas(members: int, desired: int, is_primary: bool, has_primary: bool,
                    do_not_proxy: bool) -> Decision:
    if members > desired and desired > 0:
        return _PLAIN[S.RESOLVE]  # at the next revision: the allocator is removing some
    if members == 0 or members < desired:
        return Decision(S.ERROR, Status.INSUFFICIENT_JOURNAL_BROKERS,
                        f"route has {members} of {desired} desired replicas")
    if not is_primary:
        if not has_primary:
            return Decision(S.ERROR, Status.NO_JOURNAL_PRIMARY_BROKER, "route has no primary")
        if do_not_proxy:
            return Decision(S.ERROR, Status.NOT_JOURNAL_PRIMARY_BROKER, "not the primary")
        return _PLAIN[S.PROXY]
    return _PLAIN[S.VALIDATE_PRECONDITIONS]


def index_ahead_message(journal: str, spool_end: int, index_end: int,
                        route: Route | None = None) -> str:
    """The words of INDEX_HAS_GREATER_OFFSET (Gazette's fail-to-safety): the route was
    rebuilt from members that never held the journal (or lost their spools), so its
    synchronized spool is behind what the store already holds. Appending there would
    write offsets the store has a second time; only an operator knows the members that
    held the rest are gone for good, and reset-head says so."""
    who = ", ".join(str(m) for m in route.members) if route is not None and route.members else ""
    members = f"its route ({who})" if who else "its route"
    if spool_end == 0:
        held = f"no member of {members} ever held it (their spools start at offset 0)"
    else:
        held = f"no member of {members} holds it past offset {spool_end}"
    return (f"journal {journal}: {held}, while the fragment index has content up to offset "
            f"{index_end}; appends are refused so that no offset below {index_end} is written "
            f"twice. If the members that held it are gone for good, run "
            f"`quire journals reset-head -j {journal}` to continue at offset {index_end}")


def validate_preconditions(req: AppendRequest, spec: JournalSpec, registers: LabelSet,
                           spool_end: int, index_end: int, route: Route | None = None) -> Decision:
    """Gazette's checks, in its order. `route`: named in a refusal's words."""
    if spec.suspend.level != SuspendLevel.NONE and req.suspend == "no-resume":
        return Decision(S.ERROR, Status.SUSPENDED, f"journal is {spec.suspend.level.value}-suspended")
    if req.check_registers is not None and registers.labels \
            and not req.check_registers.matches(registers):
        return Decision(S.ERROR, Status.REGISTER_MISMATCH,
                        f"registers {registers} do not match {req.check_registers}")
    if spec.suspend.offset > spool_end:
        return Decision(S.SEND_PIPELINE_SYNC, roll_to=spec.suspend.offset)
    head = max(spool_end, index_end)
    if spool_end != head and req.offset == 0 and spec.writable:
        return Decision(S.ERROR, Status.INDEX_HAS_GREATER_OFFSET,
                        index_ahead_message(req.journal, spool_end, index_end, route))
    if req.offset != 0 and req.offset != head:
        return Decision(S.ERROR, Status.WRONG_APPEND_OFFSET,
                        f"requested offset {req.offset}, write head is {head}")
    if req.offset != 0 and req.offset != spool_end:
        return Decision(S.SEND_PIPELINE_SYNC, roll_to=req.offset)  # reset-head
    if spec.suspend.level != SuspendLevel.NONE and req.suspend == "resume":
        # Synchronized and validated: resume at our write head, then resolve the
        # journal's restored route (coordinator/suspend.py). `keep` never gets here.
        return Decision(S.RESOLVE, suspend=Suspend(level=SuspendLevel.NONE, offset=spool_end))
    return _PLAIN[S.STREAM_CONTENT]


def decide_suspended(level: SuspendLevel, req_suspend: str, offset: int) -> Decision | None:
    """A FULL-suspended journal has no replicas to resolve to: resume it or refuse.

    None when the journal is not fully suspended (resolve as usual). A RESOLVE decision
    carries the suspension to write first (the seed's "resumed first").
    """
    if level != SuspendLevel.FULL:
        return None
    if req_suspend == "resume":
        return Decision(S.RESOLVE, suspend=Suspend(level=SuspendLevel.NONE, offset=offset))
    return Decision(S.ERROR, Status.SUSPENDED, "journal is fully suspended")


def decide_broken(commit_sent: bool, reason: str, exc: BaseException | None = None) -> Decision:
    """The answer to an append whose pipeline broke (a peer failed, an acknowledgement
    timed out or was not OK, a proxy's upstream was lost).

    Before any commit proposal carrying the append's content left this broker the
    failure is *definite*: replicas roll uncommitted content back when the stream ends,
    so UNAVAILABLE (retriable) is the truth. Once the commit was sent to any peer, that
    peer may have adopted it and a later pipeline sync (largest offset wins) can make it
    visible: the outcome is unknown, COMMIT_UNKNOWN, and the client must not re-send.
    A zero-byte append (a transaction barrier) commits no content or registers, so a
    broken barrier stays UNAVAILABLE: re-sending it cannot write anything twice.
    A spool that could not write (`exc` carries a `spool_status`: pipeline.SpoolWriteFailed)
    answers with that status before the commit left: SPOOL_FULL or SPOOL_FAILED, its
    message naming the member and the reason (spool_health.py).
    """
    if commit_sent:
        return Decision(S.ERROR, Status.COMMIT_UNKNOWN, f"the commit was sent, then {reason}")
    spool_status = getattr(exc, "spool_status", None)
    if spool_status is not None:
        return Decision(S.ERROR, spool_status, str(exc))
    return Decision(S.ERROR, Status.UNAVAILABLE, reason)


def next_registers(current: LabelSet, req: AppendRequest) -> LabelSet:
    """Subtract, then union (Gazette's order)."""
    out = current
    if req.subtract_registers is not None:
        out = out.subtract(req.subtract_registers)
    if req.union_registers is not None:
        out = out.union(req.union_registers)
    return out


def edits_registers(req: AppendRequest) -> bool:
    return bool((req.union_registers and req.union_registers.labels)
                or (req.subtract_registers and req.subtract_registers.labels))
