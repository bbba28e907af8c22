"""Multiplexed replicate connections: one connection per (primary, peer) coordinator,
carrying every journal's replicate stream as a channel.

A connection opens as any other (Hello → HelloAck) with `Hello(mux=True)`; from then
on every frame, either way, travels in an envelope:

    u32 channel | frame (wire.py: u32 length | u8 kind | u32 header_length | ...)

Channel 0 is the connection itself (an ErrorFrame there says why it is being closed);
the primary numbers its channels from 1 and never reuses a number on a connection.
A channel opens with its own Hello (its journal's token: checked by the peer before
anything else of that channel is read) and ends with a ChannelClose from either side.
A channel's failure (a refusal, an invalid stream, a spool that cannot write) ends that
channel only; the connection's failure (a malformed envelope, a lost socket) ends all
of its channels, whose pipelines then rebuild as they did over their own connections.

Received bytes are parsed where they land, in the protocol's `on_data` callback
(frame_protocol.py): every complete frame is handed to its channel synchronously, so a
wake-up of the connection costs no task switch per channel or per frame. A channel with
a `listener` (the pipeline's acknowledgement reader, coordinator/pipeline.py) is called
once per wake-up in which it received frames, after the whole pass, and at its end:
the acknowledgements of every journal on the connection are taken in one pass, with no
task per journal or per commit. A frame is
checked as wire.py checks it (`check_fields`) before its body is awaited; a malformed
one raises ProtocolError from `parse_envelopes` and nothing else.

This module is the envelope and the primary's side of one connection
(`MuxConnection`, `Channel`, which offers the FrameStream methods a pipeline uses);
the primary's pool of them, one per peer, and the fallback for a peer that does not
multiplex, are protocol/mux_pool.py; the replica's side is coordinator/replicate_mux.py.
Compiled with mypyc (protocol/native.py, docs/compiled.md): keep its annotations exact.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable

from .errors import ProtocolError
from .frame_protocol import FrameProtocol
from .messages import ChannelClose, ErrorFrame, Message
from .stream import FLUSH_BYTES, ConnectionClosed, FrameStream
from .wire import PREFIX_SIZE, Frame, check_fields, decode_header, encode_frame

CHANNEL = struct.Struct("!I")
ENVELOPE = struct.Struct("!IIBI")
"""channel, then the frame's own prefix (length, kind, header_length)."""
ENVELOPE_SIZE = ENVELOPE.size  # 13
CONNECTION = 0
"""The channel number of the connection itself."""

Sink = Callable[[int, int, memoryview, int, int, int], None]
"""sink(channel, kind, view, head, hlen, stop): one complete frame, its header at
view[head:head + hlen] and its payload at view[head + hlen:stop] (valid during the call
only: copy what is kept)."""


def envelope(channel: int, message: Message, payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """One message in `channel`'s envelope (buffers for writelines)."""
    return [CHANNEL.pack(channel), *encode_frame(message, payload)]


def parse_envelopes(protocol: FrameProtocol, sink: Sink) -> None:
    """Hand every complete enveloped frame buffered on `protocol` to `sink`, consuming
    them; a malformed envelope raises ProtocolError (the connection must end)."""
    buf, pos, end = protocol.buf, protocol.start, protocol.end
    unpack = ENVELOPE.unpack_from
    try:
        with memoryview(buf) as view:
            while end - pos >= ENVELOPE_SIZE:
                channel, length, kind, hlen = unpack(buf, pos)
                check_fields(length, kind, hlen)  # before the body is waited for
                stop = pos + 8 + length
                if stop > end:
                    break
                sink(channel, kind, view, pos + 4 + PREFIX_SIZE, hlen, stop)
                pos = stop
    finally:
        if pos != protocol.start:
            protocol.consume(pos - protocol.start)


def decode(kind: int, view: memoryview, head: int, hlen: int, stop: int) -> Frame:
    """A sink's frame, decoded and copied out of the buffer."""
    message = decode_header(kind, view[head:head + hlen])
    start = head + hlen
    return Frame(message, bytes(view[start:stop]) if stop > start else b"")


class Channel:
    """One journal's replicate stream inside a MuxConnection, as the primary sees it:
    the FrameStream methods a pipeline uses (write_encoded, writable, drain, read,
    read_buffered, take_copies, send, read_message, close, abort)."""

    __slots__ = ("conn", "number", "tag", "inbox", "closed", "listener", "touched", "_waiter")

    def __init__(self, conn: MuxConnection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.tag = CHANNEL.pack(number)
        self.inbox: deque[Frame] = deque()
        self.closed: BaseException | None = None
        """Why the channel ended (set once: a ChannelClose, the connection's end, ours)."""
        self.listener: Callable[[], None] | None = None
        """Called after each pass over received bytes that delivered frames to this
        channel, and when it ends (it reads `inbox` and `closed` itself; it must not
        raise: an error there is its own channel's to handle)."""
        self.touched = False
        """Listed for the connection's end-of-pass calls."""
        self._waiter: asyncio.Future[None] | None = None

    # -- the connection's calls ---------------------------------------------------------

    def deliver(self, frame: Frame) -> None:
        self.inbox.append(frame)
        if self.listener is not None and not self.touched:
            self.touched = True
            self.conn.touched.append(self)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def ended(self, exc: BaseException) -> None:
        if self.closed is None:
            self.closed = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        listener = self.listener
        if listener is not None:
            listener()

    # -- receive ------------------------------------------------------------------------

    def take_copies(self, frame: bytes) -> int:
        """How many acknowledgements equal to the connection's constant lead the inbox
        (`frame` must be that constant's encoding); they are consumed."""
        inbox, const = self.inbox, self.conn.constant
        n = 0
        while inbox and inbox[0] is const:
            inbox.popleft()
            n += 1
        return n

    def read_buffered(self) -> Frame | None:
        return self.inbox.popleft() if self.inbox else None

    async def read(self) -> Frame:
        while True:
            if self.inbox:
                return self.inbox.popleft()
            if self.closed is not None:
                raise ConnectionClosed(f"channel {self.number} ended: {self.closed}")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read_message(self, expect: type | tuple[type, ...]) -> tuple:
        return FrameStream.expect(await self.read(), expect)

    # -- send ---------------------------------------------------------------------------

    def write_encoded(self, bufs: list[bytes | memoryview]) -> None:
        if self.closed is not None:
            raise ConnectionClosed(f"channel {self.number} ended: {self.closed}")
        self.conn.queue(self.tag, bufs)

    def write(self, message: Message, payload: bytes | memoryview = b"") -> None:
        self.write_encoded(encode_frame(message, payload))

    async def send(self, message: Message, payload: bytes | memoryview = b"") -> None:
        self.write(message, payload)
        self.conn.flush()
        await self.drain()

    def writable(self) -> bool:
        return self.closed is None and self.conn.stream.writable()

    async def drain(self) -> None:
        if self.closed is not None:
            raise ConnectionClosed(f"channel {self.number} ended: {self.closed}")
        await self.conn.stream.drain()

    # -- end ----------------------------------------------------------------------------

    def abort(self) -> None:
        """End the channel (the peer rolls back what it holds uncommitted); the
        connection and its other channels go on."""
        if self.closed is None:
            self.closed = ConnectionClosed("closed by us")
            self.conn.release(self, "closed")
        self.ended(self.closed)

    async def close(self) -> None:
        self.abort()


class MuxConnection:
    """The primary's end of one multiplexed connection to one peer."""

    def __init__(self, stream: FrameStream, constant: tuple[bytes, Frame],
                 on_idle: Callable[[MuxConnection], None] | None = None) -> None:
        self.stream = stream
        self.protocol = stream.protocol
        self.channels: dict[int, Channel] = {}
        self._next = 1
        self._ack_bytes, self.constant = constant
        self._out: list[bytes | memoryview] = []
        self._queued = 0
        self._flush_pending = False
        self._on_idle = on_idle
        self.touched: list[Channel] = []
        """Channels with a listener that received frames in the current pass."""
        self.failed: BaseException | None = None
        self.protocol.on_data = self._on_data
        self._on_data()  # (anything that came with the HelloAck)

    def open_channel(self) -> Channel:
        if self.failed is not None:
            raise ConnectionClosed(f"replicate connection failed: {self.failed!r}")
        number, self._next = self._next, self._next + 1
        ch = self.channels[number] = Channel(self, number)
        return ch

    # -- send ---------------------------------------------------------------------------

    def queue(self, tag: bytes, bufs: list[bytes | memoryview]) -> None:
        """Queue one frame of a channel; the queue goes out in one writelines by the
        end of this loop iteration (or once FLUSH_BYTES wait), as FrameStream's does."""
        out = self._out
        out.append(tag)
        out += bufs
        self._queued += 4 + sum(map(len, bufs))
        if self._queued >= FLUSH_BYTES:
            self.flush()
        elif not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._deferred_flush)

    def _deferred_flush(self) -> None:
        self._flush_pending = False
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - the connection is gone: reads and drain() say so
            pass

    def flush(self) -> None:
        out = self._out
        if out:
            self._out, self._queued = [], 0
            self.stream.transport.writelines(out)  # type: ignore[union-attr]

    def release(self, ch: Channel, reason: str) -> None:
        """A channel we end: the peer is told (unless the connection is gone)."""
        if self.channels.pop(ch.number, None) is None:
            return
        if self.failed is None:
            self.queue(ch.tag, encode_frame(ChannelClose(reason=reason)))
        if not self.channels and self._on_idle is not None:
            self._on_idle(self)

    # -- receive ------------------------------------------------------------------------

    def _on_data(self) -> None:
        p = self.protocol
        try:
            parse_envelopes(p, self._sink)
        except ProtocolError as exc:
            self._notify()  # (what was delivered before the bad envelope counts)
            self.fail(exc)
            return
        self._notify()
        if p.lost or p.eof:
            self.fail(p.exc or ConnectionClosed("replicate connection closed by peer"))

    def _notify(self) -> None:
        """Each listening channel that received frames in this pass, called once."""
        touched = self.touched
        if touched:
            self.touched = []
            for ch in touched:
                ch.touched = False
                listener = ch.listener
                if listener is not None:
                    listener()

    def _sink(self, channel: int, kind: int, view: memoryview, head: int, hlen: int, stop: int) -> None:
        ch = self.channels.get(channel)
        if ch is None:
            if channel == CONNECTION:
                frame = decode(kind, view, head, hlen, stop)
                if isinstance(frame.message, ErrorFrame):
                    raise ProtocolError(f"peer closed the replicate connection: "
                                        f"{frame.message.status.name}: {frame.message.message}")
            return  # (a late frame of a channel we ended)
        ack = self._ack_bytes
        if stop - head + PREFIX_SIZE == len(ack) and view[head - PREFIX_SIZE:stop] == ack:
            ch.deliver(self.constant)  # the constant acknowledgement: not decoded
            return
        frame = decode(kind, view, head, hlen, stop)
        if isinstance(frame.message, ChannelClose):
            self.channels.pop(channel, None)
            ch.ended(ConnectionClosed(f"closed by peer: {frame.message.reason}"))
            if not self.channels and self._on_idle is not None:
                self._on_idle(self)
            return
        ch.deliver(frame)

    def fail(self, exc: BaseException) -> None:
        """The connection ends: so does every channel on it."""
        if self.failed is None:
            self.failed = exc
            self.protocol.on_data = None
            self.stream.abort()
        channels, self.channels = self.channels, {}
        for ch in channels.values():
            ch.ended(exc)
        if self._on_idle is not None:
            self._on_idle(self)

    def close(self) -> None:
        self.fail(ConnectionClosed("replicate connection closed"))
