"""A fake of coordinator.pipeline.Pipeline's send/receive surface over a real spool,
with faults to inject: what the append FSM and the whole-append lane tests drive."""

from __future__ import annotations

import asyncio

from coordinator.pipeline import PipelineBroken
from coordinator.replica import Replica


class FakePipeline:
    """The send/receive surface of coordinator.pipeline.Pipeline over a real spool, with
    a fault injected at one point: `break_at` = "content" (a peer write fails on a
    content chunk), "before-commit" (the pipeline is already broken when the commit
    comes), "commit" (writing the commit to the peers fails after the local spool
    adopted it), "drain" (draining after the commit fails); `ack_error` fails the
    ticket (READ_ACKNOWLEDGEMENTS: a reset, an ACK_TIMEOUT, a non-OK answer)."""

    def __init__(self, replica: Replica, break_at: str = "", ack_error: BaseException | None = None) -> None:
        self.spool = replica.spool
        self.broken: BaseException | None = None
        self.break_at = break_at
        self.ack_error = ack_error
        self.peers_got: list[object] = []
        self.commits = 0
        """Commit proposals (ones that extend the fragment by pending content) sent."""

    def _break(self, why: str) -> PipelineBroken:
        self.broken = PipelineBroken(why)
        return self.broken

    def send_content(self, data) -> None:  # noqa: ANN001
        if self.broken is not None:
            raise PipelineBroken("pipeline broken")
        self.spool.apply_content(self.spool.delta, data)
        if self.break_at == "content":
            raise self._break("peer reset while streaming content")
        if self.break_at == "before-commit":
            self._break("peer reset after the last chunk")
        self.peers_got.append(bytes(data))

    def write_local(self) -> None:
        if self.broken is not None:
            raise PipelineBroken(f"pipeline broken: {self.broken!r}")
        self.spool.flush()

    def send_proposal(self, prop, first: bool = False):  # noqa: ANN001, ANN201
        if self.broken is not None:
            raise PipelineBroken(f"pipeline broken: {self.broken!r}")
        is_commit = self.spool.delta > 0 and prop.proposal.end > self.spool.end
        local = self.spool.apply_proposal(prop, primary=True)
        self.commits += is_commit
        if self.break_at == "commit" and is_commit:
            raise self._break("peer reset while writing the commit")
        self.peers_got.append(prop)
        return local

    async def drain(self) -> None:
        if self.break_at == "drain" and self.commits:
            raise self._break("peer reset while draining the commit")

    def ticket(self, must_ok: bool = False, fut=None):  # noqa: ANN001, ANN201
        fut = fut if fut is not None else asyncio.get_running_loop().create_future()
        if self.break_at == "drain" and self.commits:
            # The peer reset after the commit: its reader fails as its writer does.
            fut.set_exception(self._break("peer reset while draining the commit"))
            fut.exception()  # (the FSM's failed drain already decided: it never awaits it)
        elif self.ack_error is not None:
            fut.set_exception(self.ack_error)
        else:
            fut.set_result([])
        return fut

    async def gather_ok(self, ticket):  # noqa: ANN001, ANN201
        return await ticket
