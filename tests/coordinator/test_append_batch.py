"""The lane's group commit (coordinator/append_lane.py): the lane appends of one loop
turn share one commit proposal and one acknowledgement per peer, yet each is answered
with its own span and SHA-1, lands exactly once in order, and keeps every other writer
out until the commit has left; a failure fails every append of the batch alike —
definitely before the commit left, as COMMIT_UNKNOWN after."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from protocol import AppendRequest, ReplicateProposal, Status
from coordinator.append_lane import finish, try_lane
from coordinator.pipeline import PipelineBroken
from tests.coordinator.test_append_lane import _frames, _primary, _stream_of

from .test_append_fsm import J


def _take(broker, records: list[bytes]):  # noqa: ANN001, ANN202
    """One lane append per record, all in this loop turn (as a burst of connections)."""
    lanes = []
    for record in records:
        lane = try_lane(broker, _stream_of(_frames([record])), AppendRequest(journal=J))
        assert lane is not None
        lanes.append(lane)
    return lanes


def _commits(pln) -> list[ReplicateProposal]:  # noqa: ANN001
    return [p for p in pln.peers_got if isinstance(p, ReplicateProposal) and p.proposal.end > p.proposal.begin]


async def test_one_turns_appends_share_one_commit_and_keep_their_own_spans() -> None:
    broker, replica, pln = _primary()
    records = [b"first\n", b"second\n", b"third\n"]
    lanes = _take(broker, records)
    assert replica.pipeline_lock.locked() and replica.batch is not None  # until the turn ends
    answers = await asyncio.gather(*(finish(lane) for lane in lanes))
    assert [a.status for a in answers] == [Status.OK] * 3
    begin = 0
    for record, a in zip(records, answers):
        assert (a.commit.begin, a.commit.end) == (begin, begin + len(record))
        assert a.commit.sum == hashlib.sha1(record).hexdigest()
        begin += len(record)
    commits = _commits(pln)
    assert len(commits) == 1 and commits[0].proposal.end == begin  # one commit for all three
    assert commits[0].proposal.sum == hashlib.sha1(b"".join(records)).hexdigest()
    assert replica.spool.read_committed(0, begin) == b"".join(records)
    assert replica.head == begin and not replica.pipeline_lock.locked() and replica.batch is None
    # The next turn opens a new batch, behind the first.
    (a4,) = await asyncio.gather(*(finish(lane) for lane in _take(broker, [b"fourth\n"])))
    assert a4.commit.begin == begin and len(_commits(pln)) == 2


async def test_an_open_batch_keeps_the_fsm_out_until_its_commit_left() -> None:
    broker, replica, pln = _primary()
    lanes = _take(broker, [b"a", b"b"])
    seen: list[int] = []

    async def fsm() -> None:  # the FSM's ACQUIRE_PIPELINE, then what it finds
        await replica.pipeline_lock.acquire()
        seen.append(len(_commits(pln)))
        replica.pipeline_lock.release()

    task = asyncio.ensure_future(fsm())
    assert replica.pipeline_lock.locked()  # held by the batch
    await asyncio.gather(*(finish(lane) for lane in lanes))
    await asyncio.wait_for(task, 5)
    assert seen == [1]  # the batch's commit had left before the FSM got the pipeline
    # Once an FSM append waits for the pipeline, lane appends of the next turn queue too.
    await replica.pipeline_lock.acquire()
    waiter = asyncio.ensure_future(replica.pipeline_lock.acquire())
    await asyncio.sleep(0)
    replica.pipeline_lock.release()  # free, but promised to the waiter
    assert try_lane(broker, _stream_of(_frames([b"c"])), AppendRequest(journal=J)) is None
    await asyncio.wait_for(waiter, 5)
    replica.pipeline_lock.release()


@pytest.mark.parametrize("faults, status", [
    ({"break_at": "before-commit"}, Status.UNAVAILABLE),  # broken before the commit left
    ({"break_at": "commit"}, Status.COMMIT_UNKNOWN),       # writing the commit failed
    ({"ack_error": PipelineBroken("peer z#b answered PROPOSAL_MISMATCH")}, Status.COMMIT_UNKNOWN),
])
async def test_a_failed_commit_fails_every_append_of_its_batch(faults, status) -> None:  # noqa: ANN001
    broker, replica, pln = _primary()
    pln.break_at, pln.ack_error = faults.get("break_at", ""), faults.get("ack_error")
    lanes = _take(broker, [b"x"] if faults.get("break_at") == "before-commit" else [b"x", b"y", b"z"])
    answers = await asyncio.gather(*(finish(lane) for lane in lanes))
    assert {a.status for a in answers} == {status}
    assert replica.head == 0  # nothing published
    assert not replica.pipeline_lock.locked()


async def test_a_lane_that_fails_streaming_fails_its_batch_definitely() -> None:
    broker, replica, pln = _primary()
    pln.break_at = "content"  # the first chunk's peer write fails
    lane = try_lane(broker, _stream_of(_frames([b"x"])), AppendRequest(journal=J))
    assert lane is not None
    data = _frames([b"y"])
    conn = _stream_of(data)
    assert try_lane(broker, conn, AppendRequest(journal=J)) is None  # a doomed batch: FSM
    assert conn.protocol.unconsumed() == data  # nothing consumed
    assert (await finish(lane)).status == Status.UNAVAILABLE
    with pytest.raises(PipelineBroken):  # the batch's end: no commit, the lock let go
        await asyncio.wait_for(lane.batch.done, 5)
    assert not replica.pipeline_lock.locked() and replica.head == 0
    assert not _commits(pln)
