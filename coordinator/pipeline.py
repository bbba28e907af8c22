"""The replication pipeline: the primary's long-lived replicate streams to its peers.

A Pipeline owns the primary's Spool (it holds `replica.spool_lock` for its lifetime)
and one FrameStream per peer. It is full duplex (protocol pipelining):

* the *send side* is owned by whichever append holds `replica.pipeline_lock`; it
  applies each message to the local spool and writes it to every peer, in order;
* the *receive side* is handed out in FIFO order through a barrier: an append that
  has sent its commit takes a ticket, waits for the previous ticket holder to finish
  reading, reads exactly one response per peer, then releases its successor.

A pipeline is torn down and rebuilt only when the route changes or a peer fails;
once broken (any send or receive error) it stays broken and every later user fails
fast, so no append can be acknowledged on a pipeline with a gap in it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from quire.logs import get_logger
from quire.protocol import (
    Header,
    Hello,
    HelloAck,
    ProcessId,
    ReplicateContent,
    ReplicateProposal,
    ReplicateResponse,
    Status,
)
from quire.protocol.errors import ProtocolError, QuireError
from quire.protocol.stream import FrameStream
from quire.protocol.wire import encode_frame

from . import metrics
from .replica import Replica

log = get_logger(__name__)

CONNECT_TIMEOUT = 5.0
ACK_TIMEOUT = 30.0


class PipelineBroken(QuireError):
    """A peer stream failed; the pipeline must be rebuilt."""


class Pipeline:
    def __init__(self, replica: Replica, header: Header, me: ProcessId,
                 peers: Sequence[tuple[ProcessId, FrameStream]]) -> None:
        self.replica = replica
        self.spool = replica.spool
        self.header = header
        self.me = me
        self.peers = list(peers)
        self._streams = [s for _, s in self.peers]
        self.broken: BaseException | None = None
        self.synced = False
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.set_result(None)
        self._last_ticket: asyncio.Future[None] = done
        self._log = log.bind(journal=replica.journal, route=str(header.route),
                             revision=header.etcd.revision)

    @classmethod
    async def open(cls, replica: Replica, header: Header, me: ProcessId) -> Pipeline:
        """Connect to every peer; the caller already holds replica.spool_lock."""
        route = header.route
        streams: list[tuple[ProcessId, FrameStream]] = []
        try:
            for pid, endpoint in route.peers(me):
                stream = await FrameStream.connect(endpoint, timeout=CONNECT_TIMEOUT)
                streams.append((pid, stream))
                await stream.send(Hello())
                await asyncio.wait_for(stream.read_message(HelloAck), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError, ProtocolError) as exc:
            for _, s in streams:
                s.abort()
            raise PipelineBroken(f"connecting to peers of {route}: {exc!r}") from exc
        metrics.PIPELINE_REBUILDS.inc()
        return cls(replica, header, me, streams)

    @property
    def route(self):  # noqa: ANN201
        return self.header.route

    @property
    def revision(self) -> int:
        return self.header.etcd.revision

    def _check(self) -> None:
        if self.broken is not None:
            raise PipelineBroken(f"pipeline broken: {self.broken!r}")

    def _fail(self, exc: BaseException) -> PipelineBroken:
        if self.broken is None:
            self.broken = exc
            self._log.warning("pipeline broken", error=repr(exc))
            for _, s in self.peers:
                s.abort()
        return exc if isinstance(exc, PipelineBroken) else PipelineBroken(repr(exc))

    # -- send side (caller holds replica.pipeline_lock) -----------------------------------

    def send_proposal(self, prop: ReplicateProposal, first: bool = False) -> ReplicateResponse:
        """Apply to the local spool, then forward. Returns the local spool's answer."""
        self._check()
        local = self.spool.apply_proposal(prop, primary=True)
        if first:
            prop = ReplicateProposal(proposal=prop.proposal, registers=prop.registers,
                                     acknowledge=prop.acknowledge, header=self.header)
        self._send(encode_frame(prop))
        return local

    def send_content(self, data: bytes | memoryview) -> None:
        self._check()
        delta = self.spool.delta
        self.spool.apply_content(delta, data)
        self._send(encode_frame(ReplicateContent(content_delta=delta), data))

    def _send(self, bufs: list[bytes | memoryview]) -> None:
        """Queue one frame (encoded once) on every peer stream; they flush per loop turn."""
        try:
            for s in self._streams:
                s.write_encoded(bufs)
        except Exception as exc:  # noqa: BLE001 - any write error breaks the pipeline
            raise self._fail(exc) from exc

    async def drain(self) -> None:
        """Cheap unless a peer's transport is over its high-water mark (or lost)."""
        try:
            for s in self._streams:
                await s.drain()
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc) from exc

    # -- receive side -----------------------------------------------------------------

    def ticket(self) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
        """(wait_for, done): call under the send lock right after sending."""
        wait_for = self._last_ticket
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_ticket = done
        return wait_for, done

    async def gather(self, wait_for: asyncio.Future[None], done: asyncio.Future[None],
                     timeout: float = ACK_TIMEOUT) -> list[tuple[ProcessId, ReplicateResponse]]:
        """Our turn: read one response from every peer, then release the next ticket."""
        try:
            if not wait_for.done():
                await asyncio.shield(wait_for)
            self._check()
            out: list[tuple[ProcessId, ReplicateResponse]] = []
            try:
                # Acks usually arrive coalesced and are already buffered: no timer then.
                for pid, s in self.peers:
                    frame = s.read_buffered()
                    if frame is None:
                        break
                    out.append((pid, FrameStream.expect(frame, ReplicateResponse)[0]))
                if len(out) < len(self.peers):
                    async with asyncio.timeout(timeout):
                        for pid, s in self.peers[len(out):]:
                            msg, _ = await s.read_message(ReplicateResponse)
                            out.append((pid, msg))
            except (Exception, asyncio.CancelledError) as exc:
                # A half-read set of acks leaves the streams out of step: never reuse them.
                self._fail(exc if not isinstance(exc, asyncio.CancelledError)
                           else PipelineBroken("cancelled while reading acknowledgements"))
                raise
            return out
        finally:
            if not done.done():
                done.set_result(None)

    async def gather_ok(self, wait_for: asyncio.Future[None], done: asyncio.Future[None]) -> None:
        for pid, resp in await self.gather(wait_for, done):
            if resp.status != Status.OK:
                raise self._fail(PipelineBroken(f"peer {pid} answered {resp.status.name}: "
                                                f"{resp.message or resp.fragment}"))

    # -- teardown ---------------------------------------------------------------------

    async def close(self) -> None:
        """Graceful: wait for in-flight acknowledgements, then close every stream."""
        if self.broken is None:
            try:
                await asyncio.wait_for(asyncio.shield(self._last_ticket), ACK_TIMEOUT)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
        for _, s in self.peers:
            await s.close()
        if self.broken is None:
            self.broken = PipelineBroken("closed")
