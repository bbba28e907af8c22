"""Drive a pipeline synchronization over real Spools, pure, as append_sync.py runs it.

Shared by test_sync_epochs.py (hand-written cases) and test_sync_model.py (the
model-based property test), so both exercise the same sequence of proposals the
coordinator sends: the sync proposal (`rollback_proposal(acknowledge=True, producers=...,
epoch=True)`), `decide_sync` over the peers' answers, then roll proposals built from the
Decision — each applied to the primary's own spool first (Pipeline.send_proposal) and
then to every peer — until every peer answers OK.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.append_rules import Decision, State, decide_sync
from coordinator.spool import Spool
from protocol import ProcessId, ReplicateResponse, Route, Status

MAX_ROUNDS = 8
"""The FSM loops SEND/RECV_PIPELINE_SYNC without bound; a sync that needs more rounds
than this does not converge (a livelock the tests report)."""


def member_id(i: int) -> ProcessId:
    return ProcessId("z", f"m{i:02d}")


def route_of(primary: int, peers: Sequence[int]) -> Route:
    """The Route of members `primary` + `peers` (ids sorted, as etcd routes are)."""
    ids = sorted({primary, *peers})
    return Route(members=tuple(member_id(i) for i in ids), primary=ids.index(primary))


class SyncFailed(AssertionError):
    """decide_sync ended in ERROR (the append fails; the journal cannot be appended to
    under this route) or the rounds did not converge."""

    def __init__(self, message: str, decision: Decision | None = None) -> None:
        super().__init__(message)
        self.decision = decision


def run_sync(primary: Spool, peers: Sequence[Spool], revision: int, *,
             route: Route | None = None,
             peer_ids: Sequence[ProcessId] | None = None) -> list[Decision]:
    """One whole pipeline sync of `primary` with `peers` under route `revision`.

    Returns the decisions taken (the last one is UPDATE_ASSIGNMENTS); raises SyncFailed
    on an ERROR decision or when it does not converge within MAX_ROUNDS.
    """
    if peer_ids is None:
        peer_ids = [ProcessId("z", f"peer{i}") for i in range(len(peers))]
    if route is None:
        route = Route(members=(ProcessId("z", "primary"), *peer_ids), primary=0)
    decisions: list[Decision] = []
    prop = primary.rollback_proposal(acknowledge=True, producers=primary.producers.snapshot(),
                                     epoch=True)
    for _ in range(MAX_ROUNDS):
        # Pipeline.send_proposal: our own spool first (its answer is not consulted by
        # the sync states), then every peer under the stream's header revision.
        primary.apply_proposal(prop, primary=True, epoch=revision)
        answers: list[tuple[ProcessId, ReplicateResponse]] = [
            (pid, p.apply_proposal(prop, epoch=revision)) for pid, p in zip(peer_ids, peers)]
        d = decide_sync(answers, primary.fragment, route, revision, primary.epoch,
                        primary.epoch_begin, primary.epochs)
        decisions.append(d)
        if d.state is State.UPDATE_ASSIGNMENTS:
            return decisions
        if d.state is not State.SEND_PIPELINE_SYNC:
            raise SyncFailed(f"sync at revision {revision} failed: {d.status.name} {d.message}", d)
        producers = d.producers if d.producers is not None else primary.producers.snapshot()
        prop = primary.roll_proposal(d.roll_to, registers=d.registers, producers=producers,
                                     epoch=d.epoch, epoch_begin=d.epoch_begin, epochs=d.epochs)
    raise SyncFailed(f"sync at revision {revision} did not converge in {MAX_ROUNDS} rounds: "
                     f"{decisions}")


__all__ = ["MAX_ROUNDS", "SyncFailed", "member_id", "route_of", "run_sync", "Status"]
