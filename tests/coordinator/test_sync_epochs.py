"""A replica's unacknowledged tail from an older route never outruns content acknowledged
at the same offsets since (chaos campaign seed 5, docs/reliability.md): spools record the
epoch (route revision) of their last commit, and a sync compares epochs before offsets.
Pure: real Spools driven by the same proposals a pipeline sends, no IO."""

from __future__ import annotations

from coordinator.append_rules import State, decide_sync
from coordinator.spool import Spool
from protocol import Fragment, ProcessId, ReplicateResponse, Route, Status

J = "sync/journal"
A, X = ProcessId("z", "primary"), ProcessId("z", "stale")
ROUTE = Route(members=(A, X), primary=0, endpoints=("h:1", "h:2"))


class Observed:
    def __init__(self) -> None:
        self.closed: list[Fragment] = []
        self.discarded: list[Fragment] = []

    def on_commit(self, spool, fragment, primary):  # noqa: ANN001
        pass

    def on_closed(self, spool, fragment, file, primary):  # noqa: ANN001
        self.closed.append(fragment)
        if file is not None:
            file.discard()

    def on_discarded(self, spool, fragment):  # noqa: ANN001
        self.discarded.append(fragment)


def commit(spool: Spool, data: bytes, epoch: int, *, primary: bool = False) -> Fragment:
    spool.apply_content(spool.delta, data)
    prop = spool.commit_proposal()
    assert spool.apply_proposal(prop, primary=primary, epoch=epoch).status == Status.OK
    return prop.proposal


def test_a_stale_tail_is_discarded_not_rolled_forward_to() -> None:
    seen_a, seen_x = Observed(), Observed()
    a, x = Spool(J, observer=seen_a), Spool(J, observer=seen_x)
    # Route at revision 5: both hold the acknowledged prefix.
    for s in (a, x):
        commit(s, b"acknowledged ", 5, primary=s is a)
    # The primary of revision 5 fails mid-commit: only x adopted a 20-byte commit.
    commit(x, b"x" * 20, 5)
    # Revision 9, without x: 8 other bytes acknowledged at the same offsets.
    commit(a, b"a" * 8, 9, primary=True)
    assert (a.end, a.epoch, x.end, x.epoch) == (21, 9, 33, 5)

    # x rejoins (revision 12): the primary's sync proposal is its own fragment.
    answer = x.apply_proposal(a.rollback_proposal(acknowledge=True), epoch=12)
    assert answer.status == Status.PROPOSAL_MISMATCH and answer.epoch == 5
    d = decide_sync([(X, answer)], a.fragment, ROUTE, 12, a.epoch)
    # Largest offset would have won before (roll to 33): now we roll at our own end.
    assert d.state is State.SEND_PIPELINE_SYNC and (d.roll_to, d.epoch) == (21, 9)

    roll = a.roll_proposal(d.roll_to, epoch=d.epoch)
    assert a.apply_proposal(roll, primary=True, epoch=12).status == Status.OK
    assert x.apply_proposal(roll, epoch=12).status == Status.OK
    assert (x.begin, x.end, x.epoch) == (21, 21, 9) and x.registers == a.registers
    # The stale fragment was dropped, never closed (so never served nor persisted);
    # the primary's acknowledged fragment was closed as usual.
    assert [f.end for f in seen_x.discarded] == [33] and seen_x.closed == []
    assert [f.end for f in seen_a.closed] == [21]
    # And the pipeline is in sync: the next sync proposal is answered OK by both.
    assert x.apply_proposal(a.rollback_proposal(acknowledge=True), epoch=12).status == Status.OK


def test_a_peer_ahead_from_a_newer_or_unknown_epoch_still_wins_by_offset() -> None:
    ours = Fragment(journal=J, begin=0, end=100, sum="1" * 40)
    ahead = Fragment(journal=J, begin=50, end=300, sum="2" * 40)
    for peer_epoch, our_epoch in ((9, 5), (0, 5), (5, 0), (5, 5)):
        resp = ReplicateResponse(status=Status.PROPOSAL_MISMATCH, fragment=ahead, epoch=peer_epoch)
        d = decide_sync([(X, resp)], ours, ROUTE, 20, our_epoch)
        assert d.state is State.SEND_PIPELINE_SYNC and d.roll_to == 300, (peer_epoch, our_epoch)
        assert d.epoch == max(peer_epoch, our_epoch)


def test_a_replica_refuses_to_be_superseded_by_an_older_or_unknown_epoch() -> None:
    for ours, proposed in ((9, 5), (0, 9), (9, 9)):
        x = Spool(J)
        commit(x, b"0123456789", ours)
        roll = Spool(J).roll_proposal(4, epoch=proposed)
        assert x.apply_proposal(roll, epoch=12).status == Status.PROPOSAL_MISMATCH, (ours, proposed)
        assert x.end == 10
