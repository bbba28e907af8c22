"""The append FSM's exactly-once parts (identified appends, docs/exactly-once.md).

A mixin of `AppendFSM` (append_fsm.py), split along the seam of issue 17: a plain
append (no producer) never reaches any of this beyond one truthiness test.

* VALIDATE_PRECONDITIONS asks the journal's producer table (producers.py), under the
  pipeline's send side, whether the transaction is new, a re-send of one that already
  committed, or refused (TXN_OUT_OF_ORDER, TXN_SUPERSEDED, PRODUCER_GENERATION_RETIRED,
  HISTORY_CLOSED, BAD_REQUEST) — before the register and offset checks, which the
  original commit may have changed.
* A new transaction commits as usual, its `ProducerMark` riding on the commit
  proposal (or on the barrier of a zero-byte one, e.g. a close), so every replica
  records it when it adopts the commit.
* A re-send goes to STREAM_CONTENT like any append, but its content is read and
  dropped; a barrier behind it is acknowledged before the original commit is
  answered, because the original may still be waiting for its own acknowledgements in
  this pipeline (if they fail, so does the barrier: definitely, UNAVAILABLE).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from protocol import Fragment, ProducerMark, Status

from . import metrics
from .append_rules import AppendAborted, Decision, State, decide_broken
from .pipeline import Pipeline, PipelineBroken

if TYPE_CHECKING:
    from .replica import Replica
    from .spool import Spool


class ExactlyOnceStates:
    """Mixin: needs AppendFSM's attributes and `_go` / `_fail` / `_hand_off` / `_rollback`."""

    req: Any
    source: Any
    original: Fragment | None
    commit: Fragment | None
    registers: Any
    total_chunks: int
    _aborted: Any
    _begin: int
    _summer: Any

    def _go(self, decision: Decision | State) -> None: ...
    def _fail(self, status: Status, message: str) -> None: ...
    async def _hand_off(self, pln: Pipeline) -> None: ...
    async def _rollback(self, pln: Pipeline) -> None: ...

    def _check_producer(self, replica: Replica) -> bool:
        """An identified append: refused, a re-send (answered with its original commit,
        ahead of the register and offset checks, which the original changed), or new
        (False: validate as usual). Decided under the pipeline's send side, against a
        table that already holds every commit sent, acknowledged or not."""
        req = self.req
        v = replica.spool.producers.check(req.producer, req.generation, req.history, req.txn,
                                          req.close_history)
        if v.status != Status.OK:
            self._fail(v.status, v.message)
            return True
        if v.original is None:
            return False
        self.original = v.original
        self._go(State.STREAM_CONTENT)
        return True

    def _mark(self, spool: Spool, digest: str) -> ProducerMark:
        """The transaction's own commit, recorded with it on every replica."""
        req = self.req
        return ProducerMark(req.producer, req.generation, req.history, req.txn,
                            self._begin, spool.end + spool.delta, digest,
                            int(time.time()), req.close_history)

    async def _duplicate(self, pln: Pipeline) -> None:
        """A re-sent transaction that already committed: read (and drop) the client's
        content, then answer the original commit once a barrier behind it is
        acknowledged — the original may still be waiting for its acknowledgements in
        this pipeline, and its failure must fail the re-send too (definitely: the
        barrier writes nothing)."""
        try:
            while await self.source.next_chunk() is not None:
                self.total_chunks += 1
        except AppendAborted as exc:
            self._aborted = exc
            return await self._rollback(pln)
        try:
            pln.send_proposal(pln.spool.rollback_proposal(acknowledge=True))
        except PipelineBroken as exc:
            return self._go(decide_broken(False, str(exc)))
        self.commit = self.original
        self.registers = pln.spool.registers
        metrics.APPENDS_DEDUPLICATED.inc()
        await self._hand_off(pln)
