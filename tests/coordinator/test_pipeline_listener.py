"""The pipeline's acknowledgements over multiplexed channels (coordinator/pipeline.py,
protocol/mux.py `Channel.listener`): tickets resolve where the answers land, with no
reader task per commit, one timer bounding the wait, and every failure still failing
the waiting appends.

The real Pipeline over a real MuxPool, against the real ReplicaMux with spools on disk
(test_replicate_mux.py's peer)."""

from __future__ import annotations

import asyncio

import pytest

from coordinator import pipeline as pipeline_mod
from coordinator.pipeline import PipelineBroken

from .test_replicate_mux import _append, _pipeline, _serving


class _Mute:
    """A transport whose writes go nowhere; everything else is the real one's."""

    def __init__(self, transport) -> None:  # noqa: ANN001
        self._transport = transport

    def write(self, data) -> None:  # noqa: ANN001
        pass

    def writelines(self, bufs) -> None:  # noqa: ANN001
        pass

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._transport, name)


async def test_commits_of_many_journals_resolve_without_a_reader_task(tmp_path) -> None:  # noqa: ANN001
    async with _serving(tmp_path) as (peer, pool):
        plns = [await _pipeline(peer, pool, f"lst/j{i}", tmp_path) for i in range(6)]
        assert all(p._listening for p in plns)
        for round_ in range(3):
            # Every journal's commit in one loop turn: one write to the peer, and its
            # answers resolve each journal's ticket from the connection's receive pass.
            tickets = []
            for i, pln in enumerate(plns):
                pln.send_content(b"j%d r%d;" % (i, round_))
                pln.send_proposal(pln.spool.commit_proposal())
                tickets.append(pln.ticket(must_ok=True))
                assert pln._reader is None  # no task was started for the ticket
            answers = await asyncio.wait_for(asyncio.gather(*tickets), 10)
            assert all(a[0][1].status.name == "OK" for a in answers), answers
        for i in range(6):
            spool = peer.replicas[f"lst/j{i}"].spool
            assert spool.end == sum(len(b"j%d r%d;" % (i, r)) for r in range(3))
        assert all(p._reader is None and p.broken is None for p in plns)
        for pln in plns:
            await pln.close()


async def test_close_waits_for_the_commit_in_flight(tmp_path) -> None:  # noqa: ANN001
    async with _serving(tmp_path) as (peer, pool):
        pln = await _pipeline(peer, pool, "lst/close", tmp_path)
        pln.send_content(b"last words")
        pln.send_proposal(pln.spool.commit_proposal())
        ticket = pln.ticket(must_ok=True)
        await asyncio.wait_for(pln.close(), 10)
        assert ticket.done() and not ticket.cancelled() and ticket.exception() is None
        assert peer.replicas["lst/close"].spool.end == len(b"last words")


async def test_an_unanswered_commit_breaks_the_pipeline_after_the_ack_timeout(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(pipeline_mod, "ACK_TIMEOUT", 0.3)
    async with _serving(tmp_path) as (peer, pool):
        slow = await _pipeline(peer, pool, "lst/slow", tmp_path)
        (mux,) = peer.muxes
        # The replica applies, but its answers never leave (its transport swallows them;
        # ReplicaMux is compiled, so its methods cannot be patched: docs/compiled.md).
        mux.stream.transport = _Mute(mux.stream.transport)
        with pytest.raises(PipelineBroken, match="no acknowledgement from a peer within 0.3 s"):
            await asyncio.wait_for(_append(slow, b"unanswered"), 10)
        with pytest.raises(PipelineBroken):
            slow.send_content(b"after")  # broken stays broken


async def test_a_pipeline_broken_on_the_send_side_fails_its_waiting_tickets(tmp_path) -> None:  # noqa: ANN001
    async with _serving(tmp_path) as (peer, pool):
        pln = await _pipeline(peer, pool, "lst/torn", tmp_path)
        other = await _pipeline(peer, pool, "lst/other", tmp_path)
        pln.send_content(b"in flight")
        pln.send_proposal(pln.spool.commit_proposal())
        ticket = pln.ticket(must_ok=True)
        pln._fail(PipelineBroken("torn down by the test"))  # as a failed send does
        with pytest.raises(PipelineBroken):
            await asyncio.wait_for(ticket, 10)
        await _append(other, b"unaffected")  # the connection and its other channel go on
        assert peer.accepted == 1
