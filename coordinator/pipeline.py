"""The replication pipeline: the primary's long-lived replicate streams to its peers.

A Pipeline owns the primary's Spool (it holds `replica.spool_lock` for its lifetime)
and one stream per peer: a channel of this coordinator's one multiplexed connection to
that peer (protocol/mux.py: every journal's stream to a peer shares it), or a
FrameStream of its own. It is full duplex (protocol pipelining):

* the *send side* is owned by whichever append holds `replica.pipeline_lock`; it
  applies each message to the local spool and writes it to every peer, in order;
* the *receive side* resolves tickets: an append that has sent its commit takes a
  ticket (a future), and tickets are resolved in order, as many per wake-up as the
  peers' buffered answers complete. When every peer stream is a channel of a
  multiplexed connection, that happens where the answers land: the connection calls
  the pipeline once per wake-up in which its channel received frames (protocol/mux.py
  `Channel.listener`), so a commit costs no task, no timeout context and no future of
  the reader's own — one pass over the connection's bytes resolves the commits of
  every journal it carries — and one timer per pipeline bounds the wait (ACK_TIMEOUT
  without progress). Otherwise (a peer that does not multiplex) one reader task does
  it while acknowledgements are outstanding.

A pipeline is torn down and rebuilt only when the route changes or a peer fails;
once broken (any send or receive error) it stays broken and every later user fails
fast, so no append can be acknowledged on a pipeline with a gap in it.

Compiled with mypyc (protocol/native.py, docs/compiled.md): exact annotations, causes
set with `caused()` (mypyc drops `raise ... from`), one name per `except` clause.
"""

from __future__ import annotations

import asyncio
from collections import deque
from itertools import repeat

import msgspec
from collections.abc import Callable, Sequence
from ssl import SSLContext

from protocol.logs import get_logger
from protocol import (
    Header,
    Hello,
    HelloAck,
    ProcessId,
    ReplicateContent,
    ReplicateProposal,
    ReplicateResponse,
    Route,
    Status,
)
from protocol.errors import ProtocolError, QuireError, caused
from protocol.mux import Channel
from protocol.mux_pool import MuxPool, NotMultiplexed
from protocol.stream import FrameStream
from protocol.wire import Frame, FrameTemplate, encode_frame

from . import metrics
from .replica import Replica
from .spool import OK as ACK_OK

log = get_logger(__name__)

CONNECT_TIMEOUT = 5.0
ACK_TIMEOUT = 30.0

ACK_OK_FRAME = b"".join(encode_frame(ACK_OK))
"""A replica's plain acknowledgement, encoded: always these bytes (replicate_api.py)."""
REPLICATE_ACK = (ACK_OK_FRAME, Frame(ACK_OK))
"""The constant a multiplexed connection counts instead of decoding (protocol/mux.py)."""
_CONTENT_AT_0 = FrameTemplate(ReplicateContent(content_delta=0))
"""An append's first (usually only) chunk."""


class PipelineBroken(QuireError):
    """A peer stream failed; the pipeline must be rebuilt."""


class SpoolWriteFailed(PipelineBroken):
    """A spool (ours, or a peer's that said so) could not write: `spool_status` is
    SPOOL_FULL or SPOOL_FAILED and the message names the member and the reason
    (spool_health.py). Before a commit left, the append's answer is that status."""

    def __init__(self, message: str, status: Status) -> None:
        super().__init__(message)
        self.message = message
        self.spool_status = status


class Pipeline:
    def __init__(self, replica: Replica, header: Header, me: ProcessId,
                 peers: Sequence[tuple[ProcessId, FrameStream | Channel]]) -> None:
        self.replica = replica
        self.spool = replica.spool
        self.header = header
        self.me = me
        self.peers = list(peers)
        self._streams = [s for _, s in self.peers]
        self.broken: BaseException | None = None
        self.synced = False
        self._tickets: deque[tuple[asyncio.Future[list[tuple[ProcessId, ReplicateResponse]]], bool]] = deque()
        self._answers: list[deque[ReplicateResponse]] = [deque() for _ in self._streams]
        self._reader: asyncio.Task[None] | None = None
        channels = [st for st in self._streams if isinstance(st, Channel)]
        self._channels: list[Channel] = channels if len(channels) == len(self._streams) else []
        """The peer streams, when every one is a mux channel (else empty)."""
        self._listening = bool(self._channels)
        """Every peer is a mux channel: tickets resolve in the channels' listener."""
        self._resolving = False
        self._resolved = 0
        """Tickets resolved so far (the ack timer's measure of progress)."""
        self._timer: asyncio.TimerHandle | None = None
        for ch in self._channels:
            ch.listener = self._on_answers
        self.fence: Callable[[], bool] | None = None
        """False once our keyspace shows the route superseded (fence.PrimaryFence): no
        commit is acknowledged after that (an early exit; the peers are the fence)."""
        self._log = log.bind(journal=replica.journal, route=str(header.route),
                             revision=header.etcd.revision)

    @classmethod
    async def open(cls, replica: Replica, header: Header, me: ProcessId, *, token: str = "",
                   ssl: SSLContext | None = None, mux: MuxPool | None = None) -> Pipeline:
        """Connect to every peer; the caller already holds replica.spool_lock. `token`:
        this coordinator's derived REPLICATE token for the journal (auth_gate.py); a
        peer that refuses it fails the pipeline (closed, never open without auth).
        `mux`: each peer stream is a channel of our one connection to that peer
        (protocol/mux.py); without it, a connection of its own."""
        route = header.route
        streams: list[tuple[ProcessId, FrameStream | Channel]] = []
        try:
            for pid, endpoint in route.peers(me):
                if not endpoint:
                    # A member whose key is gone while its assignment lives on (its key
                    # deleted by hand, leases expiring as etcd wakes): not reachable yet.
                    raise ConnectionError(f"no endpoint for {pid} (its member key is gone)")
                if mux is not None:
                    try:
                        streams.append((pid, await mux.open(endpoint, token=token, ssl=ssl,
                                                            timeout=CONNECT_TIMEOUT)))
                        continue
                    except NotMultiplexed:
                        pass  # an older peer: a connection of this stream's own
                stream = await FrameStream.connect(endpoint, timeout=CONNECT_TIMEOUT, ssl=ssl)
                streams.append((pid, stream))
                await stream.send(Hello(token=token))
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    await stream.read_message(HelloAck)
        except (OSError, asyncio.TimeoutError, ProtocolError) as exc:
            for _, s in streams:
                s.abort()
            raise caused(PipelineBroken(f"connecting to peers of {route}: {exc!r}"), exc)
        metrics.PIPELINE_REBUILDS.inc()
        return cls(replica, header, me, streams)

    @property
    def route(self) -> Route:
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
        try:
            local = self.spool.apply_proposal(prop, primary=True, epoch=self.revision)
        except OSError as exc:  # a roll's seal or a rollback's truncate of a failing disk
            raise caused(self._spool_failed(exc), exc)
        if first:
            prop = msgspec.structs.replace(prop, header=self.header)
        self._send(encode_frame(prop))
        return local

    def send_content(self, data: bytes | memoryview) -> None:
        self._check()
        delta = self.spool.delta
        try:
            self.spool.apply_content(delta, data)
        except OSError as exc:
            raise caused(self._spool_failed(exc), exc)
        self._send(_CONTENT_AT_0.encode(data) if delta == 0
                   else encode_frame(ReplicateContent(content_delta=delta), data))

    def _send(self, bufs: list[bytes | memoryview]) -> None:
        """Queue one frame (encoded once) on every peer stream; they flush per loop turn."""
        try:
            for s in self._streams:
                s.write_encoded(bufs)
        except Exception as exc:  # noqa: BLE001 - any write error breaks the pipeline
            raise caused(self._fail(exc), exc)

    def writable(self) -> bool:
        """No peer stream is over its high-water mark (drain() would not wait)."""
        for s in self._streams:
            if not s.writable():
                return False
        return True

    async def drain(self) -> None:
        """Cheap unless a peer's transport is over its high-water mark (or lost)."""
        try:
            for s in self._streams:
                await s.drain()
        except Exception as exc:  # noqa: BLE001
            raise caused(self._fail(exc), exc)

    # -- receive side -----------------------------------------------------------------

    def ticket(self, must_ok: bool = False, fut: asyncio.Future | None = None
               ) -> asyncio.Future[list[tuple[ProcessId, ReplicateResponse]]]:
        """A future of the peers' answers to the proposal just sent (call under the send
        lock, right after sending it). `must_ok`: any non-OK answer breaks the pipeline
        (commits and rollbacks; a sync proposal's answers are the FSM's to judge).
        `fut`: resolve this future (made earlier, e.g. by a group commit) instead."""
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
        if self.broken is not None:
            fut.set_exception(PipelineBroken(f"pipeline broken: {self.broken!r}"))
        elif not self._streams:
            try:  # no peers (R=1): the local spool already adopted it; once on file, done
                self._flush_local()
                fut.set_result([])
            except PipelineBroken as exc:
                fut.set_exception(exc)
        else:
            self._tickets.append((fut, must_ok))
            if self._listening:
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(
                        ACK_TIMEOUT, self._ack_timer, self._resolved)
                for ch in self._channels:  # (answers already here, or a channel gone)
                    if ch.inbox or ch.closed is not None:
                        self._on_answers()
                        break
            elif self._reader is None:
                self._reader = asyncio.get_running_loop().create_task(self._read_acks())
        return fut

    def _on_answers(self) -> None:
        """The channels' listener (protocol/mux.py): take every buffered answer and
        resolve the tickets they complete; a channel that ended with tickets
        outstanding, or any failure, breaks the pipeline and fails them. Never raises
        (it runs in the connection's receive callback)."""
        if self._resolving:
            return  # (a channel aborted by our own _fail: the handler below sees to it)
        tickets = self._tickets
        self._resolving = True
        try:
            if self.broken is not None:
                if tickets:
                    raise PipelineBroken(f"pipeline broken: {self.broken!r}")
                return
            self._take_buffered()
            if tickets:
                self._resolve_ready()
            if tickets:
                for ch, q in zip(self._channels, self._answers):
                    closed = ch.closed
                    if closed is not None and not q:
                        raise PipelineBroken(f"replicate channel ended: {closed}")
            # (An armed timer stays armed when no ticket is left: it finds none and
            # lapses; arming and cancelling one per commit would cost more than the
            # commit's own resolution.)
        except Exception as exc:  # noqa: BLE001 - every waiting append gets the failure
            self._fail_tickets(self._fail(exc))
        finally:
            self._resolving = False

    def _ack_timer(self, resolved: int) -> None:
        """ACK_TIMEOUT after it was armed: no ticket resolved since, while some were
        outstanding, breaks the pipeline (a wait is bounded by ACK_TIMEOUT without
        progress, at most twice that for one ticket); otherwise armed again."""
        self._timer = None
        if not self._tickets or self.broken is not None:
            return
        if self._resolved == resolved:
            self._fail_tickets(self._fail(TimeoutError(
                f"no acknowledgement from a peer within {ACK_TIMEOUT} s")))
            return
        self._timer = asyncio.get_running_loop().call_later(ACK_TIMEOUT, self._ack_timer,
                                                            self._resolved)

    def _fail_tickets(self, broken: BaseException) -> None:
        tickets = self._tickets
        while tickets:
            fut, _ = tickets.popleft()
            if not fut.done():
                fut.set_exception(broken)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _take_buffered(self) -> None:
        """Every answer already buffered on each peer stream, onto its queue."""
        expect = FrameStream.expect
        for s, q in zip(self._streams, self._answers):
            while True:
                oks = s.take_copies(ACK_OK_FRAME)  # plain acks: counted, not decoded
                if oks:
                    q.extend(repeat(ACK_OK, oks))
                frame = s.read_buffered()
                if frame is None:
                    break
                q.append(expect(frame, ReplicateResponse)[0])

    def _resolve_ready(self) -> None:
        """Resolve, in order, every ticket each peer has answered; a must_ok ticket
        answered otherwise raises (the pipeline breaks)."""
        tickets, queues = self._tickets, self._answers
        ready = min(map(len, queues))
        if not ready:
            return
        fence = self.fence
        if fence is not None and not fence():
            raise PipelineBroken("route superseded: this coordinator is no "
                                 "longer the journal's primary")
        self._flush_local()  # nothing is acknowledged before it is on file
        for _ in range(min(ready, len(tickets))):
            fut, must_ok = tickets.popleft()
            self._resolved += 1
            answers = [(pid, q.popleft()) for (pid, _), q in zip(self.peers, queues)]
            if must_ok:
                for pid, resp in answers:
                    if resp.status == Status.OK:
                        continue
                    if resp.status in (Status.SPOOL_FULL, Status.SPOOL_FAILED):
                        err: PipelineBroken = SpoolWriteFailed(
                            resp.message or f"peer {pid}: {resp.status.name}", resp.status)
                    else:
                        err = PipelineBroken(f"peer {pid} answered {resp.status.name}: "
                                             f"{resp.message or resp.fragment}")
                    if not fut.done():  # (popped already: the caller's handler misses it)
                        fut.set_exception(err)
                    raise err
            if not fut.done():
                fut.set_result(answers)

    async def _read_acks(self) -> None:
        """The one reader of every peer stream while tickets are outstanding.

        Peers answer acknowledged proposals in order, so the k-th answer of each peer
        belongs to the k-th ticket. Each wake-up parses everything already buffered on
        every peer and resolves all complete tickets at once, in order (so appends
        finish in commit order); it waits, bounded by ACK_TIMEOUT, only on a peer that
        is short of answers. It exits once no ticket is outstanding: an idle pipeline
        costs no task. An FSM that stops waiting (cancelled) leaves the streams in step.
        """
        tickets, streams, queues = self._tickets, self._streams, self._answers
        expect = FrameStream.expect
        try:
            while tickets:
                self._take_buffered()
                self._resolve_ready()
                if not tickets:
                    break
                i = next(i for i, q in enumerate(queues) if not q)
                async with asyncio.timeout(ACK_TIMEOUT):
                    frame = await streams[i].read()
                queues[i].append(expect(frame, ReplicateResponse)[0])
        except (Exception, asyncio.CancelledError) as exc:
            self._fail_tickets(self._fail(exc if not isinstance(exc, asyncio.CancelledError)
                                          else PipelineBroken("cancelled while reading acknowledgements")))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._reader = None

    def _flush_local(self) -> None:
        """The local spool's write-behind reaches its file (spool_files.py), or the
        pipeline breaks: an acknowledgement never covers bytes we failed to write."""
        try:
            self.spool.flush()
        except OSError as exc:
            raise caused(self._spool_failed(exc), exc)

    def write_local(self) -> None:
        """Before a commit leaves: every byte it covers is on our spool file, or the
        pipeline breaks with SpoolWriteFailed while the failure is still definite (no
        peer can have adopted a commit that never left)."""
        self._check()
        self._flush_local()

    def _spool_failed(self, exc: OSError) -> PipelineBroken:
        health = self.replica.health
        if health is not None:
            status, message = health.write_failed(exc, f"journal {self.replica.journal}")
        else:
            status, message = Status.SPOOL_FAILED, f"member {self.me}: spool write failed: {exc}"
        return self._fail(SpoolWriteFailed(message, status))

    async def gather(self, ticket: asyncio.Future[list[tuple[ProcessId, ReplicateResponse]]]
                     ) -> list[tuple[ProcessId, ReplicateResponse]]:
        """Our turn's answers, one per peer (the reader enforces ACK_TIMEOUT)."""
        return await ticket

    async def gather_ok(self, ticket: asyncio.Future[list[tuple[ProcessId, ReplicateResponse]]]
                        ) -> list[tuple[ProcessId, ReplicateResponse]]:
        """`gather` (a must_ok ticket only resolves with all-OK answers)."""
        return await ticket

    # -- teardown ---------------------------------------------------------------------

    async def close(self) -> None:
        """Graceful: wait for in-flight acknowledgements, then close every stream."""
        if self.broken is None:
            reader = self._reader
            waiting: asyncio.Future | None = reader
            if waiting is None and self._tickets:
                waiting = self._tickets[-1][0]  # (listening: the last ticket resolves last)
            if waiting is not None:
                try:
                    async with asyncio.timeout(ACK_TIMEOUT + 1):
                        await asyncio.shield(waiting)
                except asyncio.CancelledError:
                    # The ticket's own waiter was cancelled (an append's handler, at
                    # shutdown) and the future with it: nothing left to wait for. Only
                    # a cancellation of this task goes on (a coordinator stopping with
                    # a commit in flight exited 1 here).
                    me = asyncio.current_task()
                    if me is not None and me.cancelling():
                        raise
                except Exception:  # noqa: BLE001 - TimeoutError included, or a failed ticket
                    pass
        for _, s in self.peers:
            await s.close()
        if self.broken is None:
            self.broken = PipelineBroken("closed")
