"""STREAM_CONTENT takes frames the client already sent without a coroutine each
(`ContentSource.next_buffered`, append_api.ClientSource): it must write exactly what
the one-frame-at-a-time path writes — the same bytes at the same offsets, the same
SHA-1s and registers, the same proposals to the peers — however the append is cut into
chunks and however much of it had arrived, and still roll back on a failure."""

from __future__ import annotations

import asyncio
import hashlib
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import AppendRequest, LabelSet, Status
from coordinator.append_fsm import NOT_BUFFERED, AppendAborted, AppendFSM, State
from coordinator.replica import Replica
from coordinator.spool import MemoryFiles
from tests.coordinator.test_append_fsm import J, _Source, run_owned
from tests.coordinator.fake_pipeline import FakePipeline


class _Arriving(_Source):
    """Frames of which some have already arrived (`arrived[i]`): those are served by
    next_buffered(); any other frame only by an awaited next_chunk()."""

    def __init__(self, items: list, arrived: list[bool]) -> None:
        super().__init__(*items)
        self.arrived = list(arrived)
        self.taken_buffered = 0

    def next_buffered(self):  # noqa: ANN201
        if not self.items or not self.arrived[0]:
            return NOT_BUFFERED
        self.arrived.pop(0)
        self.taken_buffered += 1
        item = self.items.pop(0)
        if isinstance(item, AppendAborted):
            raise item
        return item

    async def next_chunk(self):  # noqa: ANN201
        self.arrived.pop(0)
        return await super().next_chunk()


async def _append(replica: Replica, pln: FakePipeline, source: _Source,
                  union: LabelSet | None = None) -> AppendFSM:
    """One append from VALIDATE_PRECONDITIONS on an owned, synchronized pipeline."""
    return await run_owned(replica, pln, AppendRequest(journal=J, union_registers=union), source)


def _chunks(content: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(content)})
    bounds = [0, *points, len(content)]
    return [content[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


async def _run_both(prior: bytes, content: bytes, cuts: list[int], arrived: list[bool],
                    union: LabelSet | None):  # noqa: ANN202
    out = []
    for fast in (False, True):
        replica = Replica(J, MemoryFiles())
        pln = FakePipeline(replica)
        first = await _append(replica, pln, _Source(prior, None) if prior else _Source(None))
        assert first.state is State.FINISHED
        chunks = _chunks(content, cuts)
        items = [*chunks, None]
        source = _Arriving(items, arrived[:len(items)] + [True] * (len(items) - len(arrived))) \
            if fast else _Source(*items)
        fsm = await _append(replica, pln, source, union)
        spool = replica.spool
        out.append(SimpleNamespace(
            state=fsm.state, commit=fsm.commit, registers=fsm.registers, head=replica.head,
            fragment=spool.fragment, spool_registers=spool.registers,
            stored=spool.read_committed(spool.begin, spool.end - spool.begin),
            content_to_peers=b"".join(x for x in pln.peers_got if isinstance(x, bytes)),
            proposals=[x for x in pln.peers_got if not isinstance(x, bytes)],
            chunks=fsm.total_chunks,
            buffered=getattr(source, "taken_buffered", 0)))
    return out


@settings(max_examples=120, deadline=None)
@given(prior=st.binary(max_size=64), content=st.binary(max_size=600),
       cuts=st.lists(st.integers(0, 600), max_size=8),
       arrived=st.lists(st.booleans(), max_size=10),
       union=st.sampled_from([None, LabelSet.of({"k": "v"})]))
def test_buffered_frames_write_what_one_at_a_time_writes(prior, content, cuts, arrived, union) -> None:  # noqa: ANN001
    slow, fast = asyncio.run(_run_both(prior, content, cuts, arrived, union))
    assert slow.state is fast.state
    assert fast.fragment == slow.fragment and fast.stored == slow.stored
    assert fast.proposals == slow.proposals and fast.registers == slow.registers
    if not content and union is not None:  # a zero-byte append cannot edit registers
        assert fast.state is State.ERROR and fast.head == len(prior)
        return
    assert fast.state is State.FINISHED
    assert (fast.commit.begin, fast.commit.end, fast.commit.sum) == \
        (slow.commit.begin, slow.commit.end, slow.commit.sum)
    assert (fast.commit.begin, fast.commit.end) == (len(prior), len(prior) + len(content))
    if content:
        assert fast.commit.sum == hashlib.sha1(content).hexdigest()
    assert fast.registers == slow.registers and fast.spool_registers == slow.spool_registers
    assert fast.fragment == slow.fragment and fast.head == slow.head == len(prior) + len(content)
    assert fast.stored == slow.stored == prior + content
    assert fast.content_to_peers == slow.content_to_peers == prior + content
    assert fast.proposals == slow.proposals
    assert fast.chunks == slow.chunks


async def test_whole_append_in_the_buffer_takes_no_awaited_chunk() -> None:
    replica = Replica(J, MemoryFiles())
    source = _Arriving([b"one ", b"two\n", None], [True, True, True])
    fsm = await _append(replica, FakePipeline(replica), source)
    assert fsm.state is State.FINISHED and source.taken_buffered == 3
    assert (fsm.commit.begin, fsm.commit.end) == (0, 8) and replica.head == 8


async def test_peer_failure_mid_append_on_buffered_frames_is_definite_and_rolls_back() -> None:
    # A peer write fails on a buffered chunk: nothing commits, the answer is definite
    # (UNAVAILABLE), the commit never leaves and nothing is published.
    replica = Replica(J, MemoryFiles())
    pln = FakePipeline(replica, break_at="content")
    fsm = await _append(replica, pln, _Arriving([b"part 1", b"part 2\n", None], [True] * 3))
    assert fsm.state is State.ERROR and fsm.status == Status.UNAVAILABLE
    assert not fsm.commit_sent and pln.commits == 0 and replica.head == 0
    # Broken after the last buffered chunk, before the commit: the commit never leaves.
    replica = Replica(J, MemoryFiles())
    pln = FakePipeline(replica, break_at="before-commit")
    fsm = await _append(replica, pln, _Arriving([b"record\n", None], [True, True]))
    assert fsm.state is State.ERROR and fsm.status == Status.UNAVAILABLE and not fsm.commit_sent
    assert pln.commits == 0 and replica.head == 0


async def test_client_abort_in_the_buffer_rolls_back() -> None:
    replica = Replica(J, MemoryFiles())
    pln = FakePipeline(replica)
    fsm = await _append(replica, pln, _Arriving([b"x", AppendAborted("client aborted: bye")],
                                                [True, True]))
    assert fsm.state is State.ERROR and fsm.status == Status.ABORTED and not fsm.commit_sent
    assert replica.spool.delta == 0 and replica.spool.end == 0 and replica.head == 0
    rollback = pln.peers_got[-1]
    assert rollback.proposal == replica.spool.fragment and rollback.acknowledge
