"""The append FSM's streaming states: STREAM_CONTENT (content to the pipeline, then the
commit or a rollback) and READ_ACKNOWLEDGEMENTS (the replicas' answers).

A mixin of `AppendFSM` (append_fsm.py), which walks RESOLVE .. VALIDATE_PRECONDITIONS
and the pipeline states before it. STREAM_CONTENT releases the pipeline's send side
after taking a receive-side ticket (`_hand_off`), so the next append streams while this
one waits for its acknowledgements.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from protocol import Fragment, Status

from . import metrics
from .append_rules import AppendAborted, State, decide_broken, edits_registers, next_registers
from .pipeline import Pipeline, PipelineBroken
from .replica import Replica

__all__ = ["NOT_BUFFERED", "ContentSource", "StreamStates", "roll_asked"]


NOT_BUFFERED: Any = object()
"""`ContentSource.next_buffered()`: the next frame has not fully arrived yet."""


def roll_asked(roll_below: int, begin: int, content_length: int) -> bool:
    """An append's `roll_below` asks to close an open fragment holding content below it
    (the jobs scheduler completing a window, docs/jobs.md); an empty spool never rolls."""
    return roll_below > begin and content_length > 0


class ContentSource(Protocol):
    async def next_chunk(self) -> bytes | memoryview | None:
        """The next non-empty chunk, or None once the client commits. Raises AppendAborted."""

    # Optional: `next_buffered()` is next_chunk() for a frame already received, and
    # NOT_BUFFERED (nothing taken) when the next frame has not fully arrived.

    def throttled(self, seconds: float) -> None:
        """The broker held the append back this long (max rate): not the client's delay."""


class ProxiedSource(ContentSource, Protocol):
    """A source an append is proxied from (append_api.proxy_append)."""

    done: bool
    """Its terminator (commit or abort) was read: the client's connection is in step."""


class AnswerSink(Protocol):
    """Where a proxied append's answer goes (append_api.proxy_append): the client's
    FrameStream. A Protocol, not FrameStream itself: FrameStream is a compiled class
    (docs/compiled.md), which a compiled signature checks exactly, and the tests hand
    proxy_append fakes."""

    async def send(self, message: Any, payload: bytes | memoryview = b"") -> None: ...


class StreamStates:
    """Mixin: needs AppendFSM's attributes and `_go` / `_fail` / `_release_pipeline`,
    and the exactly-once `_duplicate` / `_mark` (append_eo.py)."""

    req: Any
    res: Any
    source: Any
    pipeline: Pipeline | None
    replica: Replica | None

    async def _on_stream_content(self) -> None:
        pln, replica, spec = self.pipeline, self.replica, self.res.spec
        assert pln is not None and replica is not None
        if self.original is not None:
            return await self._duplicate(pln)
        spool = replica.spool
        started = spool.delta == 0 and self.total_chunks == 0
        if started:
            frag = spec.fragment
            if spool.should_roll(frag.length, frag.compression_codec, frag.flush_interval) \
                    or roll_asked(self.req.roll_below, spool.fragment.begin, spool.content_length):
                pln.send_proposal(spool.roll_proposal(codec=frag.compression_codec, acknowledge=False))
            self._summer = hashlib.sha1()
            self._begin = spool.end
            self._limiter = replica.limiter_for(spec.max_append_rate)
        # Frames the client already sent are taken without a coroutine each (the whole
        # append, commit included, is usually in the buffer by now): the same checks and
        # the same spool/peer writes per chunk, and one drain before the commit instead
        # of one per chunk — a peer lost while streaming is still found before the
        # commit leaves (definite). Not with a max rate: its limiter may have to wait.
        buffered = getattr(self.source, "next_buffered", None) if self._limiter is None else None
        undrained = False
        try:
            while True:
                chunk = buffered() if buffered is not None else NOT_BUFFERED
                if chunk is NOT_BUFFERED:
                    if undrained:
                        await pln.drain()
                        undrained = False
                    chunk = await self.source.next_chunk()
                if chunk is None:
                    if undrained:
                        await pln.drain()
                    return await self._commit(pln, replica)
                if not spec.writable:
                    raise AppendAborted("journal is not writable")
                if self._limiter is not None:
                    delay = await self._limiter.acquire(len(chunk))
                    if delay:
                        self.delayed_chunks += 1
                        throttled = getattr(self.source, "throttled", None)
                        if throttled is not None:
                            throttled(delay)
                if self.total_chunks == 0 and replica.health is not None:
                    refusal = replica.health.refusal()  # a full or failed spool (spool_health.py)
                    if refusal is not None:
                        return self._fail(*refusal)
                pln.send_content(chunk)
                self._summer.update(chunk)
                self.total_chunks += 1
                undrained = True
        except AppendAborted as exc:
            self._aborted = exc
            await self._rollback(pln)
        except PipelineBroken as exc:
            # Content chunks alone are rolled back by every replica when the stream
            # ends (definite); once the commit was sent the outcome is unknown.
            self._go(decide_broken(self.commit_sent, str(exc), exc))

    async def _commit(self, pln: Pipeline, replica: Replica) -> None:
        spool = replica.spool
        carries = spool.delta != 0
        req = self.req
        begin = self._begin
        end = spool.end + spool.delta
        digest = self._summer.hexdigest() if end > begin else "0" * 40
        mark = self._mark(spool, digest) if req.producer else None
        if not carries:
            if edits_registers(req):
                self._aborted = AppendAborted("a zero-byte append cannot edit registers")
                return await self._rollback(pln)
            # A transaction barrier (an identified one records its txn, or a close).
            prop = spool.rollback_proposal(acknowledge=True, mark=mark)
        else:
            prop = spool.commit_proposal(next_registers(spool.registers, req), mark)
        if carries:
            pln.write_local()  # our spool holds every byte it covers, or a definite failure
        # send_proposal checks the pipeline before anything leaves: a broken one raises
        # with nothing sent (still definite). Past this point a peer may get the commit
        # (or, for an identified barrier, record its txn).
        self.commit_sent = (carries or mark is not None) and pln.broken is None
        local = pln.send_proposal(prop)
        if local.status != Status.OK:
            raise PipelineBroken(f"local spool refused its own proposal: {local.status.name}")
        # The append's own span (spool.end is `end` now; a barrier leaves it as it was).
        self.commit = Fragment(journal=req.journal, begin=begin, end=end, sum=digest,
                               codec=spool.fragment.codec)
        self.registers = spool.registers
        await self._hand_off(pln)

    async def _rollback(self, pln: Pipeline) -> None:
        try:
            pln.send_proposal(pln.spool.rollback_proposal(acknowledge=True))
            await self._hand_off(pln)
        except PipelineBroken as exc:
            self._go(decide_broken(self.commit_sent, str(exc)))

    async def _hand_off(self, pln: Pipeline) -> None:
        """Take a receive ticket, then release the send side to the next append."""
        self._ticket = pln.ticket(must_ok=True)
        await self._release_pipeline()
        self._go(State.READ_ACKNOWLEDGEMENTS)
        await pln.drain()

    async def _on_read_acknowledgements(self) -> None:
        pln, replica = self.pipeline, self.replica
        assert pln is not None and replica is not None and self._ticket is not None
        try:
            await self._ticket  # = pln.gather_ok(ticket), one frame less on every resume
        except Exception as exc:  # noqa: BLE001
            # A broken pipeline, a non-OK answer or ACK_TIMEOUT: some peers may have
            # adopted our commit, so after a commit this is COMMIT_UNKNOWN (not
            # UNAVAILABLE, which the client would re-send: finding 1 of reliability.md).
            return self._go(decide_broken(self.commit_sent, f"replication failed: {exc!r}"))
        if self._aborted is not None:
            metrics.APPENDS_ABORTED.labels(self._aborted.reason.split(":")[0][:40]).inc()
            return self._fail(Status.ABORTED, self._aborted.reason)
        if self.commit is not None and self.original is None:
            replica.publish(self.commit.end)  # (its bytes are counted by append_api)
        self._go(State.FINISHED)
