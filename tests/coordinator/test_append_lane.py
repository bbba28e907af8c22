"""The whole-append lane (coordinator/append_lane.py) is the FSM's steady state in one
step: over the same appends it must write, propose, answer and publish exactly what the
FSM does — however the content is cut into chunks, whether a fragment rolls, and when
the pipeline fails at any point — and whenever one of its conditions does not hold it
must leave everything (above all the client's buffered frames) to the FSM."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    AppendAbort,
    AppendChunk,
    AppendCommit,
    AppendRequest,
    Etcd,
    FragmentSpec,
    Header,
    JournalSpec,
    LabelSet,
    Status,
)
from protocol.frame_protocol import FrameProtocol
from protocol.stream import FrameStream
from protocol.wire import encode_frame_bytes
from coordinator.append_fsm import AppendFSM, State
from coordinator.append_lane import finish, try_lane
from coordinator.pipeline import PipelineBroken
from coordinator.replica import Replica
from coordinator.resolver import Resolution
from coordinator.spool import MemoryFiles
from tests.coordinator.test_append_fsm import J, ROUTE, SPEC, _Source
from tests.coordinator.fake_pipeline import FakePipeline


class _LanePipeline(FakePipeline):
    """The fake pipeline, synchronized on ROUTE, as the lane finds a live one."""

    route = ROUTE
    synced = True

    def writable(self) -> bool:
        # As FrameStream.writable: False once a transport is lost — which is when the
        # real drain() fails ("drain" fault, after this append's commit).
        return not (self.break_at == "drain" and self.commits)


def _stream_of(data: bytes) -> FrameStream:
    protocol = FrameProtocol()
    protocol.feed(data)
    return FrameStream(protocol)


def _frames(chunks: list[bytes], end: object = None) -> bytes:
    return b"".join([*(encode_frame_bytes(AppendChunk(), c) for c in chunks),
                     encode_frame_bytes(end if end is not None else AppendCommit())])


def _primary(spec: JournalSpec = SPEC, **faults) -> tuple[SimpleNamespace, Replica, _LanePipeline]:  # noqa: ANN003
    """A broker whose replica leads J on a synchronized pipeline at revision 5."""
    replica = Replica(J, MemoryFiles())
    pln = _LanePipeline(replica, **faults)
    header = Header(route=ROUTE, etcd=Etcd(revision=5))
    replica.resolution = Resolution(status=Status.OK, header=header, spec=spec, route=ROUTE,
                                    assignments=[SimpleNamespace(value=ROUTE)] * 3,
                                    is_primary=True, is_member=True)
    replica.pipeline = pln
    replica.index_ready = True
    broker = SimpleNamespace(replicas={J: replica}, index_expected=False,
                             keyspace=SimpleNamespace(revision=5, changed_revision=5))
    return broker, replica, pln


async def _by_lane(broker: SimpleNamespace, chunks: list[bytes],
                   req: AppendRequest | None = None):  # noqa: ANN202
    conn = _stream_of(_frames(chunks))
    lane = try_lane(broker, conn, req or AppendRequest(journal=J))
    assert lane is not None, "the lane declined an append it should take"
    assert not conn.protocol.buffered  # the whole append was taken
    return await finish(lane)


def _observed(replica: Replica, pln: FakePipeline, commit, registers, status):  # noqa: ANN001, ANN202
    spool = replica.spool
    return SimpleNamespace(
        status=status, commit=commit, registers=registers, head=replica.head,
        fragment=spool.fragment, spool_registers=spool.registers, delta=spool.delta,
        stored=spool.read_committed(spool.begin, spool.end - spool.begin),
        content_to_peers=b"".join(x for x in pln.peers_got if isinstance(x, bytes)),
        proposals=[x for x in pln.peers_got if not isinstance(x, bytes)])


def _chunks(content: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(content)})
    bounds = [0, *points, len(content)]
    return [content[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


async def _fsm(replica: Replica, pln: FakePipeline, chunks: list[bytes]) -> AppendFSM:
    """An append through the FSM from VALIDATE_PRECONDITIONS, on the replica's resolution
    (as test_append_fsm.run_owned, whose resolution is always SPEC's)."""
    fsm = AppendFSM(SimpleNamespace(), AppendRequest(journal=J), _Source(*chunks, None))
    fsm.res, fsm.replica, fsm.pipeline = replica.resolution, replica, pln
    await replica.pipeline_lock.acquire()
    fsm.owns_pipeline = True
    fsm.state = State.VALIDATE_PRECONDITIONS
    await fsm.run()
    return fsm


async def _both(prior: list[bytes], chunks: list[bytes], spec: JournalSpec = SPEC, **faults):  # noqa: ANN003, ANN202
    """The same appends through the FSM and through the lane: what each left behind."""
    out = []
    for lane in (False, True):
        broker, replica, pln = _primary(spec)
        for p in prior:  # earlier appends, identical on both sides (the FSM's path)
            assert (await _fsm(replica, pln, [p])).state is State.FINISHED
        pln.break_at, pln.ack_error = faults.get("break_at", ""), faults.get("ack_error")
        pln.commits = 0  # "drain" fails a drain after *this* append's commit
        if lane:
            resp = await _by_lane(broker, chunks)
            out.append(_observed(replica, pln, resp.commit, resp.registers, resp.status))
        else:
            fsm = await _fsm(replica, pln, chunks)
            out.append(_observed(replica, pln, fsm.commit if fsm.state is State.FINISHED else None,
                                 fsm.registers, fsm.status))
    return out


@settings(max_examples=60, deadline=None)
@given(prior=st.lists(st.binary(min_size=1, max_size=40), max_size=3),
       content=st.binary(min_size=1, max_size=300),
       cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=6),
       length=st.sampled_from([0, 16, 64, 1 << 20]))
def test_the_lane_writes_and_answers_as_the_fsm(prior, content, cuts, length) -> None:  # noqa: ANN001
    """Any chunking, with or without a fragment roll first (a small fragment length)."""
    spec = JournalSpec(name=J, replication=3, fragment=FragmentSpec(length=length)) if length else SPEC
    fsm, lane = asyncio.run(_both(prior, _chunks(content, cuts), spec))
    assert lane == fsm
    assert lane.status == Status.OK and lane.commit.end - lane.commit.begin == len(content)


@pytest.mark.parametrize("faults", [
    {"break_at": "content"},          # a peer write fails on a chunk: definite
    {"break_at": "before-commit"},    # already broken when the commit comes: definite
    {"break_at": "commit"},           # fails writing the commit: unknown
    {"break_at": "drain"},            # fails draining after the commit: unknown
    {"ack_error": PipelineBroken("peer z#bbbb answered PROPOSAL_MISMATCH")},
    {"ack_error": TimeoutError()},
])
async def test_a_failing_pipeline_is_answered_as_the_fsm_answers(faults) -> None:  # noqa: ANN001
    fsm, lane = await _both([b"earlier\n"], [b"rec", b"ord\n"], **faults)
    assert lane.status == fsm.status != Status.OK
    assert (lane.head, lane.fragment, lane.proposals) == (fsm.head, fsm.fragment, fsm.proposals)
    assert lane.status == (Status.UNAVAILABLE if faults.get("break_at") in ("content", "before-commit")
                           else Status.COMMIT_UNKNOWN)


def _declines(broker: SimpleNamespace, data: bytes, req: AppendRequest | None = None) -> None:
    conn = _stream_of(data)
    assert try_lane(broker, conn, req or AppendRequest(journal=J)) is None
    assert conn.protocol.unconsumed() == data  # nothing consumed


async def test_the_lane_leaves_every_other_case_to_the_fsm() -> None:
    whole = _frames([b"abc"])
    broker, replica, pln = _primary()
    _declines(broker, whole[:-1])                              # the commit has not arrived
    _declines(broker, encode_frame_bytes(AppendChunk(), b"abc"))
    _declines(broker, _frames([b"abc"], AppendAbort(reason="no")))
    _declines(broker, _frames([]))                             # a zero-byte append: a barrier
    _declines(broker, encode_frame_bytes(AppendChunk(), b"") + whole)  # an empty chunk
    for req in (AppendRequest(journal=J, offset=7), AppendRequest(journal=J, suspend="now"),
                AppendRequest(journal=J, union_registers=LabelSet.of({"k": "v"})),
                AppendRequest(journal=J, producer="w", generation=1, history=1, txn=1),
                AppendRequest(journal=J, header=Header(route=ROUTE, etcd=Etcd(revision=5))),
                AppendRequest(journal=J, min_etcd_revision=6),
                AppendRequest(journal="other/journal")):
        _declines(broker, whole, req)
    await replica.pipeline_lock.acquire()                      # an append holds the pipeline
    _declines(broker, whole)
    replica.pipeline_lock.release()
    broker.keyspace.changed_revision = 6                       # the route may have moved
    _declines(broker, whole)
    broker.keyspace.changed_revision = 5
    pln.synced = False
    _declines(broker, whole)
    pln.synced = True
    replica.spool.apply_content(0, b"left over")               # an uncommitted delta
    _declines(broker, whole)
    replica.spool.rollback()
    replica.index_ready, broker.index_expected = False, True    # the index is not loaded yet
    _declines(broker, whole)
    replica.index_ready = True
    for spec in (JournalSpec(name=J, replication=3, max_append_rate=1 << 20),
                 JournalSpec(name=J, replication=2)):          # fewer members than desired
        broker2, _, _ = _primary(spec)
        _declines(broker2, whole)
    assert (await _by_lane(broker, [b"abc"])).status == Status.OK  # and then it takes it
