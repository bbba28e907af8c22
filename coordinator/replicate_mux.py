"""The replica's end of a multiplexed replicate connection (protocol/mux.py): every
journal a primary replicates to us rides one connection, each as a channel.

Each channel is what a replicate connection was: it opens with a Hello whose token the
gate verifies (auth_gate.py), its first proposal is authorized as an RPC is, its set-up
(`replicate_api.open_session`: the route checks, the spool's lock) runs in a task of
its own, and from then on its frames are applied synchronously where the connection's
bytes land (`ReplicateSession.on_frame`, from the protocol's `on_data`): no task, queue
or wake-up per channel or per frame. Frames that arrive during the set-up wait in the
channel (at most PENDING_MAX of them).

Acknowledgements are batched per wake-up: a channel queues its answers, and at the end
of each pass over the received bytes every channel's answers go out in one writelines,
each channel's only after its spool's write-behind reached the file (spool_files.py).
A spool that cannot write ends that channel with its typed answer (SPOOL_FULL /
SPOOL_FAILED); a malformed header ends that channel with BAD_REQUEST; a malformed
envelope ends the connection (an ErrorFrame on channel 0), and with it every channel
— each rolling back what it held uncommitted and releasing its spool, as a lost
connection did. A keyspace change that fences a stream (hosting, fence.py) aborts its
channel only.

Compiled with mypyc (protocol/native.py, docs/compiled.md): its classes cannot be
patched or subclassed from outside; one name per `except` clause.
"""

from __future__ import annotations

import asyncio
from typing import Any

from protocol import ChannelClose, ErrorFrame, Hello, HelloAck, ReplicateContent, ReplicateProposal, Status
from protocol.auth import TokenError
from protocol.errors import ProtocolError
from protocol.logs import get_logger
from protocol.mux import CHANNEL, CONNECTION, decode, parse_envelopes
from protocol.stream import ConnectionClosed, FrameStream
from protocol.wire import Frame, FrameTemplate, encode_frame

from .auth_gate import ConnAuth, refusal_response
from .replicate_api import ReplicateSession, open_session

log = get_logger(__name__)

PENDING_MAX = 4096
"""Frames a channel may receive while its set-up runs (a primary sends one sync
proposal and waits for its answer: more is a broken primary)."""

_CONTENT_AT_0 = FrameTemplate(ReplicateContent(content_delta=0))
_CONTENT_0 = ReplicateContent(content_delta=0)
_CONTENT_KIND = ReplicateContent.KIND
_HELLO_KIND = Hello.KIND


class ReplicaChannel:
    """One channel at the replica: the `out` of its ReplicateSession (write,
    write_encoded, send) and the `abort` a fence calls."""

    __slots__ = ("mux", "number", "tag", "out", "auth", "session", "pending", "task",
                 "timer", "hooked", "ended")

    def __init__(self, mux: ReplicaMux, number: int) -> None:
        self.mux = mux
        self.number = number
        self.tag = CHANNEL.pack(number)
        self.out: list[bytes | memoryview] = []
        self.auth: ConnAuth | None = None
        self.session: ReplicateSession | None = None
        self.pending: list[Frame] | None = None
        """Frames received while the set-up runs (None before the first proposal)."""
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.hooked = False
        """Answers wait for the spool's write-behind (while a session holds the spool)."""
        self.ended = False

    def write_encoded(self, bufs: list[bytes | memoryview]) -> None:
        out = self.out
        if not out:
            self.mux.dirty.append(self)
        out.append(self.tag)
        out += bufs

    def write(self, message: Any, payload: bytes | memoryview = b"") -> None:
        self.write_encoded(encode_frame(message, payload))

    async def send(self, message: Any, payload: bytes | memoryview = b"") -> None:
        self.write(message, payload)
        self.mux.flush()
        await self.mux.stream.drain()

    def unhook(self) -> None:
        """A spool write failed: the answers it would have covered never leave."""
        self.hooked = False
        self.out.clear()

    def abort(self) -> None:
        """End this channel only (a fence: the keyspace superseded its route)."""
        self.mux.end(self, "aborted by the replica")
        self.mux.flush()


class ReplicaMux:
    def __init__(self, server: Any, stream: FrameStream) -> None:
        self.server = server
        self.stream = stream
        self.protocol = stream.protocol
        self.channels: dict[int, ReplicaChannel] = {}
        self.dirty: list[ReplicaChannel] = []
        self.failed: BaseException | None = None
        self._event = asyncio.Event()
        self._paused = False

    async def serve(self) -> None:
        """Until the connection ends (or we are cancelled): every channel then ends."""
        p = self.protocol
        p.on_data = self._on_data
        self._on_data()  # (anything that came with the Hello)
        try:
            while not self._ended():
                await self._event.wait()
                self._event.clear()
                if not self._ended() and self._paused:
                    await self.stream.drain()  # the primary is slow to read our answers
                    self._paused = False
                    p._resume_reading()
        except (ProtocolError, OSError) as exc:
            self.fail(exc)
        finally:
            self.fail(ConnectionClosed("replicate connection closed"))

    def _ended(self) -> bool:
        """`fail` has run. A call, not `self.failed is None` in serve's loop: mypy keeps
        an attribute narrowed across an await, and mypyc then checks the narrowed type
        (None) when the loop reads `failed` again after `fail` set it."""
        return self.failed is not None

    # -- the connection's bytes ---------------------------------------------------------

    def _on_data(self) -> None:
        p = self.protocol
        try:
            parse_envelopes(p, self._sink)
        except ProtocolError as exc:
            log.info("closing a replicate connection that broke the protocol",
                     peer=self.stream.peer, error=str(exc))
            self.flush()
            self.stream.write_encoded([CHANNEL.pack(CONNECTION),
                                       *encode_frame(ErrorFrame(message=str(exc)[:1000]))])
            self.fail(exc)
            return
        self.flush()
        if p.lost or p.eof:
            self.fail(p.exc or ConnectionClosed("replicate connection closed by peer"))
        elif not self._paused and not self.stream.writable():
            self._paused = True
            p._pause_reading()
            self._event.set()

    def _sink(self, number: int, kind: int, view: memoryview, head: int, hlen: int, stop: int) -> None:
        ch = self.channels.get(number)
        session = ch.session if ch is not None else None
        if ch is not None and session is not None and ch.pending is None:  # the steady state
            if kind == _CONTENT_KIND and view[head:head + hlen] == _CONTENT_AT_0.header:
                msg: Any = _CONTENT_0
                payload: bytes | memoryview = bytes(view[head + hlen:stop])
            else:
                try:
                    frame = decode(kind, view, head, hlen, stop)
                except ProtocolError as exc:
                    return self._bad(ch, exc)
                msg, payload = frame.message, frame.payload
                if isinstance(msg, ChannelClose):
                    return self.end(ch, None)
            try:
                if session.on_frame(msg, payload):
                    return
            except Exception as failed:  # noqa: BLE001 - one journal's failure is its own
                log.exception("replicate channel failed", journal=session.replica.journal)
                ch.write(ErrorFrame(status=Status.UNAVAILABLE, message=f"internal error: {failed!r}"[:1000]))
            return self.end(ch, "stream ended")
        if ch is None:
            if kind != _HELLO_KIND or number == CONNECTION:
                return  # a late frame of a channel that ended here
            ch = self.channels[number] = ReplicaChannel(self, number)
        try:
            frame = decode(kind, view, head, hlen, stop)
        except ProtocolError as exc:
            return self._bad(ch, exc)
        msg = frame.message
        if isinstance(msg, ChannelClose):
            return self.end(ch, None)
        if ch.auth is None:
            return self._hello(ch, msg)
        if ch.pending is None:
            return self._first(ch, frame)
        if len(ch.pending) >= PENDING_MAX:
            return self._bad(ch, ProtocolError(f"more than {PENDING_MAX} frames before the "
                                               "stream's first answer"))
        ch.pending.append(frame)

    def _bad(self, ch: ReplicaChannel, exc: ProtocolError) -> None:
        log.info("ending a replicate channel that broke the protocol", peer=self.stream.peer,
                 error=str(exc))
        ch.unhook()
        ch.write(ErrorFrame(status=Status.BAD_REQUEST, message=str(exc)[:1000]))
        self.end(ch, "protocol error")

    def _hello(self, ch: ReplicaChannel, msg: Any) -> None:
        if not isinstance(msg, Hello):
            return self._bad(ch, ProtocolError(f"expected Hello, got {type(msg).__name__}"))
        try:
            ch.auth = self.server.gate.admit(msg.token, self.stream.peer)
        except TokenError as exc:
            ch.write(ErrorFrame(status=Status.UNAUTHORIZED, message=f"token refused: {exc}"))
            return self.end(ch, "unauthorized")
        ch.write(HelloAck(process_id=self.server.me))

    def _first(self, ch: ReplicaChannel, frame: Frame) -> None:
        msg, auth = frame.message, ch.auth
        assert auth is not None
        if not isinstance(msg, ReplicateProposal):
            return self._bad(ch, ProtocolError(f"expected a ReplicateProposal, got "
                                               f"{type(msg).__name__}"))
        if auth.on:
            left = auth.remaining() or 0.0
            if left <= 0:
                ch.write(ErrorFrame(status=Status.UNAUTHORIZED, message="token expired"))
                return self.end(ch, "token expired")
            refusal = auth.check(msg, self.server._labels_of)
            if refusal is not None:
                ch.write(refusal_response(msg, refusal)[0])
                return self.end(ch, "forbidden")
            # The stream ends when its token does; the primary re-forms it.
            ch.timer = asyncio.get_running_loop().call_later(left, self._expired, ch)
        ch.pending = []
        ch.task = asyncio.get_running_loop().create_task(self._setup(ch, frame))

    def _expired(self, ch: ReplicaChannel) -> None:
        ch.timer = None
        if not ch.ended:
            log.info("replicate stream cut at token expiry", subject=ch.auth.subject if ch.auth else "",
                     journal=ch.session.replica.journal if ch.session else "")
            self.end(ch, "token expired")
            self.flush()

    async def _setup(self, ch: ReplicaChannel, first: Frame) -> None:
        try:
            assert isinstance(first.message, ReplicateProposal)  # (_first checked it)
            session = await open_session(self.server, ch, first.message, ch.unhook)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - this channel's failure only
            log.exception("replicate stream set-up failed")
            ch.write(ErrorFrame(status=Status.UNAVAILABLE, message=f"internal error: {exc!r}"[:1000]))
            session = None
        finally:
            ch.task = None
        if session is None or ch.ended:
            if session is not None:
                session.finish()
            self.end(ch, "refused")
            self.flush()
            return
        ch.session, ch.hooked = session, True
        frames, ch.pending = [first] + (ch.pending or []), None
        for frame in frames:
            if isinstance(frame.message, ChannelClose):
                self.end(ch, None)
                break
            try:
                if session.on_frame(frame.message, frame.payload):
                    continue
            except Exception as exc:  # noqa: BLE001
                log.exception("replicate channel failed", journal=session.replica.journal)
                ch.write(ErrorFrame(status=Status.UNAVAILABLE, message=f"internal error: {exc!r}"[:1000]))
            self.end(ch, "stream ended")
            break
        self.flush()

    # -- answers ------------------------------------------------------------------------

    def _release(self, ch: ReplicaChannel) -> None:
        """A channel's queued answers may leave once its spool's bytes are on file."""
        if ch.out and ch.hooked and ch.session is not None and not ch.session.finished:
            try:
                ch.session.spool.flush()
            except OSError as exc:
                ch.session._write_failed(exc)  # (clears the answers, queues the refusal)
                ch.hooked = False
                self.end(ch, "spool write failed")

    def flush(self) -> None:
        """Every channel's queued answers, in one writelines."""
        dirty = self.dirty
        if not dirty:
            return
        self.dirty = []
        out: list[bytes | memoryview] = []
        for ch in dirty:
            self._release(ch)
            out += ch.out
            ch.out = []
        if out and self.failed is None:
            self.stream.send_encoded(out)

    # -- ends ---------------------------------------------------------------------------

    def end(self, ch: ReplicaChannel, reason: str | None) -> None:
        """End a channel: its session rolls back and releases the spool. `reason`: tell
        the primary (None: it closed the channel itself)."""
        if ch.ended:
            return
        ch.ended = True
        self.channels.pop(ch.number, None)
        if ch.timer is not None:
            ch.timer.cancel()
            ch.timer = None
        if ch.task is not None:
            ch.task.cancel()
            ch.task = None
        session = ch.session
        if session is not None and not session.finished:
            self._release(ch)  # (answers already queued go out first, as on a connection)
            ch.hooked = False
            try:
                session.finish()
            except OSError as exc:  # a failed rollback write: the lock went all the same
                log.warning("rolling back a replicate stream failed", error=repr(exc))
        if reason is not None and self.failed is None:
            ch.write(ChannelClose(reason=reason))

    def fail(self, exc: BaseException) -> None:
        """The connection ends, and with it every channel."""
        if self.failed is not None:
            return
        self.failed = exc
        self.protocol.on_data = None
        for ch in list(self.channels.values()):
            self.end(ch, None)
        self.dirty = []
        self.stream.abort()
        self._event.set()


async def serve_mux(server: Any, conn: FrameStream) -> None:
    """Serve a multiplexed replicate connection (its Hello(mux=True) answered)."""
    await ReplicaMux(server, conn).serve()
