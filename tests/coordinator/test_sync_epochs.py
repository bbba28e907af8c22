"""A replica's unacknowledged tail from an older route never outruns content acknowledged
at the same offsets since (chaos campaign seed 5, docs/reliability.md): spools record the
epoch (route revision) of their last commit, and a sync compares epochs before offsets.
Pure: real Spools driven by the same proposals a pipeline sends, no IO."""

from __future__ import annotations

from coordinator.append_rules import State, decide_sync
from coordinator.replica import Replica
from coordinator.replicate_api import take_spool
from coordinator.spool import MemoryFiles, Spool
from protocol import Fragment, ProcessId, ReplicateResponse, Route, Status

from .sync_driver import run_sync

J = "sync/journal"
A, X = ProcessId("z", "primary"), ProcessId("z", "stale")
ROUTE = Route(members=(A, X), primary=0, endpoints=("h:1", "h:2"))


class Observed:
    def __init__(self) -> None:
        self.closed: list[Fragment] = []
        self.cut: list[tuple[Fragment, int]] = []

    def on_commit(self, spool, fragment, primary):  # noqa: ANN001
        pass

    def on_closed(self, spool, fragment, file, primary):  # noqa: ANN001
        self.closed.append(fragment)
        if file is not None:
            file.discard()

    def on_discarded(self, spool, fragment, at):  # noqa: ANN001
        self.cut.append((fragment, at))


def commit(spool: Spool, data: bytes, epoch: int, *, primary: bool = False) -> Fragment:
    spool.apply_content(spool.delta, data)
    prop = spool.commit_proposal()
    assert spool.apply_proposal(prop, primary=primary, epoch=epoch).status == Status.OK
    return prop.proposal


def content(spool: Spool) -> bytes:
    return spool.read_committed(spool.begin, spool.content_length)


def sync(primary: Spool, peers: list[Spool], revision: int) -> None:
    """One pipeline synchronization as append_sync.py runs it, to completion (the sync
    proposal, decide_sync over the answers, a roll applied to the primary then to every
    peer, until every peer answers OK): sync_driver.run_sync."""
    run_sync(primary, peers, revision)


def test_a_stale_tail_is_cut_not_rolled_forward_to() -> None:
    """Seed 5: a replica rejoins with a longer tail of an older epoch."""
    seen_a, seen_x = Observed(), Observed()
    a, x = Spool(J, observer=seen_a), Spool(J, observer=seen_x)
    # Route at revision 5: both hold the acknowledged prefix.
    for s in (a, x):
        commit(s, b"acknowledged ", 5, primary=s is a)
    # The primary of revision 5 fails mid-commit: only x adopted a 20-byte commit.
    commit(x, b"x" * 20, 5)
    # Revision 9, without x: 8 other bytes acknowledged at the same offsets.
    commit(a, b"a" * 8, 9, primary=True)
    assert (a.end, a.epoch, a.epoch_begin, x.end, x.epoch) == (21, 9, 13, 33, 5)

    # x rejoins (revision 12): the sync proposal says our content is of epoch 9 from 13.
    answer = x.apply_proposal(a.rollback_proposal(acknowledge=True, epoch=True), epoch=12)
    # x cut its stale tail at 13 and rolled forward to our end (answering with its
    # new, empty fragment there, as any replica rolled forward by a sync does).
    assert answer.status == Status.PROPOSAL_MISMATCH and answer.fragment.begin == 21
    assert (x.begin, x.end, x.epoch, x.epoch_begin) == (21, 21, 9, 13)
    assert x.registers == a.registers
    # The stale bytes were cut before the fragment was closed: what x closed (serves,
    # persists) is the acknowledged prefix only.
    assert [(f.end, at) for f, at in seen_x.cut] == [(33, 13)]
    assert [(f.begin, f.end) for f in seen_x.closed] == [(0, 13)]
    sync(a, [x], revision=12)  # and the pipeline converges: both at 21, nothing lost
    assert (a.end, x.end) == (21, 21) and seen_a.cut == []


def test_a_stale_primary_is_cut_too_and_rolls_to_the_newer_content() -> None:
    """Seed 3, the mirror of seed 5: the *primary* holds the older epoch's longer tail
    and the replica the newer, acknowledged content at the same offsets. Before, the
    replica was rolled forward past its content by the primary's longer proposal."""
    seen_p, seen_r = Observed(), Observed()
    p, r = Spool(J, observer=seen_p), Spool(J, observer=seen_r)
    for s in (p, r):
        commit(s, b"prefix ", 5, primary=s is p)
    commit(p, b"p" * 30, 5, primary=True)  # p's commit failed on r: never acknowledged
    commit(r, b"r" * 10, 9)  # revision 9 (without p) acknowledged these at 7
    assert (p.end, r.end, r.epoch_begin) == (37, 17, 7)

    sync(p, [r], revision=12)  # p is primary again
    # p cut its tail at 7 and rolled to r's end, taking r's registers; r is untouched.
    assert [(f.end, at) for f, at in seen_p.cut] == [(37, 7)]
    assert [(f.begin, f.end) for f in seen_p.closed] == [(0, 7)]
    assert [(f.begin, f.end) for f in seen_r.closed] == [(0, 17)]
    assert seen_r.cut == []
    assert (p.begin, p.end, p.epoch, r.begin, r.end) == (17, 17, 9, 17, 17)


def test_a_shorter_stale_replica_is_cut_before_it_is_rolled_forward() -> None:
    """A stale tail shorter than the newer content used to be closed as it was (stale
    bytes served and persisted) when the replica was rolled forward."""
    seen_x = Observed()
    a, x = Spool(J), Spool(J, observer=seen_x)
    for s in (a, x):
        commit(s, b"prefix ", 5, primary=s is a)
    commit(x, b"x" * 4, 5)
    commit(a, b"a" * 40, 9, primary=True)
    sync(a, [x], revision=12)
    assert [(f.begin, f.end) for f in seen_x.closed] == [(0, 7)]
    assert [at for _, at in seen_x.cut] == [7]
    assert (x.begin, x.end, x.epoch) == (47, 47, 9)


def test_three_members_two_epochs_and_the_acknowledged_content_survives() -> None:
    """p (stale, longest), r1 (newest epoch, acknowledged) and r2 (an older, shorter
    stale tail): every stale tail goes, the newest content stands everywhere."""
    p, r1, r2 = Spool(J), Spool(J), Spool(J)
    for s in (p, r1, r2):
        commit(s, b"base ", 3, primary=s is p)
    commit(p, b"P" * 50, 5, primary=True)
    commit(r2, b"Q" * 3, 4)
    commit(r1, b"acked", 8)
    sync(p, [r1, r2], revision=20)
    assert p.end == r1.end == r2.end == 10
    assert p.epoch == r1.epoch == r2.epoch == 8


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


def test_a_tail_is_cut_where_the_first_newer_epoch_begins_not_the_newest() -> None:
    """test_sync_model's counterexample: the member with the newest epoch (4, from 1)
    also holds acknowledged content of an epoch in between (3, from 0). A tail of epoch
    2 at 0-1 ended at the newest epoch's begin, so it passed for current and was
    closed — stale bytes at an acknowledged offset, served and persisted. The epoch
    history says epoch 3 began at 0: the tail is cut there, whichever side holds it."""
    for stale_is_primary in (True, False):
        seen_stale, seen_new = Observed(), Observed()
        stale, new, other = Spool(J, observer=seen_stale), Spool(J, observer=seen_new), Spool(J)
        commit(stale, b"\x00", 2, primary=True)  # revision 2: the commit reached no peer
        for s in (new, other):  # revision 3 (without `stale`) acknowledged 0-1
            commit(s, b"\x01", 3, primary=s is new)
        commit(new, b"\x00", 4, primary=True)  # revision 4 (`new` alone) acknowledged 1-2
        assert (new.epoch, new.epoch_begin, new.epochs) == (4, 1, ((3, 0), (4, 1)))
        if stale_is_primary:
            sync(stale, [new], revision=5)
        else:
            sync(new, [stale], revision=5)
        assert [(f.begin, f.end, at) for f, at in seen_stale.cut] == [(0, 1, 0)], stale_is_primary
        assert seen_stale.closed == [] and seen_new.cut == []
        assert (stale.end, new.end, stale.epochs) == (2, 2, ((3, 0), (4, 1)))


def test_a_former_primarys_uncommitted_content_does_not_fail_the_next_sync() -> None:
    """test_sync_model: a primary whose pipeline broke after the append's content but
    before its commit keeps that content as its spool's delta. When a new primary's
    stream takes the spool, a roll forward past its end but within end + delta looked
    like a mismatch, and the sync failed (PROPOSAL_MISMATCH, peer behind). Taking the
    spool (replicate_api.take_spool) now drops uncommitted content too."""
    former = Replica(J, MemoryFiles())
    new = Spool(J)
    for s in (former.spool, new):
        commit(s, b"123456789", 4, primary=s is new)
    commit(new, b"xxxxx", 5, primary=True)  # revision 5: reached no peer
    former.spool.apply_content(0, b"yyyyyy")  # revision 6: former is primary; no commit
    take_spool(former)  # revision 7: new's replicate stream takes the spool
    assert former.spool.delta == 0
    sync(new, [former.spool], revision=7)
    assert (new.end, former.spool.end) == (14, 14)
