"""asyncio adapters for the frame codec: one connection = a FrameStream.

Thin IO around wire.py over a FrameProtocol (frame_protocol.py), which owns the read
buffer: a frame's 9-byte prefix is checked as soon as it is buffered, before its body is
waited for — so a hostile peer costs at most one frame of memory — and a whole frame is
decoded where the transport (or TLS) put it.

Writes are coalesced: `write()` queues the frame's buffers (never copying a payload)
and the queue goes to the transport in one `writelines` — at the end of the current
event-loop iteration, as soon as `FLUSH_BYTES` are queued, or on `send()`/`flush()`/
`close()`/`abort()`. Every frame written in one iteration (say, the commits of several
pipelined appends, or the acknowledgements of a replica) thus costs one syscall and
one wake-up of the peer. `drain()` waits only while the transport is over its high-water
mark (or the connection is lost), so calling it per chunk is cheap.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import ProtocolError, caused
from .frame_protocol import FrameProtocol
from .messages import ErrorFrame, Message
from .resolve import is_address, resolve
from .status import Status
from .wire import (
    MAX_CHUNK,
    MAX_FRAME,
    PREFIX,
    PREFIX_SIZE,
    Frame,
    check_fields,
    decode_header,
    encode_frame,
)

M = TypeVar("M", bound=Message)

FLUSH_BYTES = 256 << 10
"""Queued bytes that force a flush before the end of the loop iteration."""
SOCKET_BUFFER = 1 << 21
"""SO_SNDBUF / SO_RCVBUF asked of the kernel: fewer, larger reads and writes."""


class ConnectionClosed(ProtocolError):
    """The peer closed the connection (cleanly or not) between or inside frames."""


async def serve_frames(handler: Callable[[FrameStream], Coroutine[Any, Any, None]], host: str, port: int,
                       **kw: Any) -> asyncio.Server:
    """A server whose every connection runs `handler(FrameStream)` in its own task
    (`kw` as loop.create_server's: ssl, backlog, ssl_handshake_timeout, ...). A handler
    that fails is reported to the loop's exception handler and its connection aborted,
    as asyncio.start_server does."""
    loop = asyncio.get_running_loop()

    def run(protocol: FrameProtocol) -> asyncio.Task[None]:
        task = loop.create_task(handler(FrameStream(protocol)))
        task.add_done_callback(lambda t: _handler_done(t, protocol))
        return task

    return await loop.create_server(lambda: FrameProtocol(on_connected=run), host, port, **kw)


def _handler_done(task: asyncio.Task[None], protocol: FrameProtocol) -> None:
    protocol.task = None
    if task.cancelled() or task.exception() is None:
        return
    asyncio.get_running_loop().call_exception_handler({
        "message": "frame connection handler failed", "exception": task.exception(),
        "protocol": protocol})
    if protocol.transport is not None:
        protocol.transport.abort()


class FrameStream:
    """One connection's frames, over a FrameProtocol (frame_protocol.py): frames are
    decoded where the transport put their bytes."""

    def __init__(self, protocol: FrameProtocol) -> None:
        self.protocol = protocol
        transport = protocol.transport
        self.transport: Any = transport
        """The protocol's transport (`Any`: uvloop's are not asyncio.Transport instances)."""
        self._out: list[bytes | memoryview] = []
        self._queued = 0
        self._flush_pending = False
        self._high = 1 << 16
        self.before_flush: Callable[[], None] | None = None
        """Called before queued frames go to the transport; if it raises, they never do
        and the connection is aborted (a replica's acknowledgements wait on its spool
        file's write-behind this way: coordinator/replicate_api.py)."""
        if transport is None:
            return
        try:
            self._high = transport.get_write_buffer_limits()[1]
        except (AttributeError, NotImplementedError):
            pass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
                except OSError:  # pragma: no cover - capped by the kernel: fine
                    pass

    @classmethod
    async def connect(cls, endpoint: str, timeout: float = 10.0,
                      ssl: ssl_module.SSLContext | None = None) -> FrameStream:
        """Connect (over TLS when given a client `ssl` context: protocol/tls.py). A name
        is looked up through protocol/resolve.py (one lookup of it at a time, a failure
        remembered for a moment), then its addresses are tried in order."""
        host, _, port_text = endpoint.rpartition(":")
        host, port = host or "127.0.0.1", int(port_text)
        loop = asyncio.get_running_loop()
        kw: dict = {"ssl": ssl, "ssl_handshake_timeout": timeout if ssl is not None else None}
        async with asyncio.timeout(timeout):
            if is_address(host):
                _, protocol = await loop.create_connection(FrameProtocol, host, port, **kw)
                return cls(protocol)
            if ssl is not None:
                kw["server_hostname"] = host  # (certificates name the host, not the address)
            last: OSError | None = None
            for _family, _type, _proto, _name, sockaddr in await resolve(host, port):
                try:
                    _, protocol = await loop.create_connection(
                        FrameProtocol, sockaddr[0], sockaddr[1], **kw)
                    return cls(protocol)
                except OSError as exc:
                    last = exc
            raise last or OSError(f"{host} has no address")

    @property
    def peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def at_eof(self) -> bool:
        """The peer closed (or the connection was lost) and every byte is consumed."""
        p = self.protocol
        return (p.eof or p.lost) and not p.buffered

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def reusable(self) -> bool:
        """Open both ways with nothing unread: an idle connection that may carry the next
        RPC (a pool's test, one call instead of at_eof() + is_closing()). A peer that sent
        EOF, or bytes nobody asked for, makes it unusable: they are not an answer to it."""
        p = self.protocol
        t = self.transport
        return not (p.eof or p.lost or p.end != p.start or t is None or t.is_closing())

    async def wait_readable(self) -> None:
        """Until a byte is buffered or the connection ends; consumes nothing."""
        p = self.protocol
        while not p.buffered and not p.eof and not p.lost:
            await p.data_waiter()

    def read_buffered(self) -> Frame | None:
        """The next frame if all of it is already buffered, else None (no waiting).

        Same checks as read(); a burst of small frames costs no coroutine switch, timer
        or extra copy per frame.
        """
        p = self.protocol
        buf, start = p.buf, p.start
        if p.end - start < PREFIX_SIZE:
            return None
        length, kind, hlen = PREFIX.unpack_from(buf, start)
        kind, hlen, plen = check_fields(length, kind, hlen)
        total = PREFIX_SIZE + hlen + plen
        if p.end - start < total:
            return None
        head = start + PREFIX_SIZE
        with memoryview(buf) as view:  # no export outlives this block: decoded, copied out
            message = decode_header(kind, view[head:head + hlen])
            payload = bytes(view[head + hlen:start + total]) if plen else b""
        p.consume(total)
        return Frame(message, payload)

    def take_run(self, body: tuple[int, bytes], end: tuple[int, bytes]) -> list[bytes] | None:
        """The payloads of a run of one or more `body` frames, each with a non-empty
        payload, closed by one `end` frame without one (each frame given as (kind, exact
        header bytes)), if the whole run is already buffered: the run is consumed. None,
        with nothing consumed, if it is not all here or any frame differs — the caller
        then reads frame by frame (read_buffered / read), which checks and decodes
        everything.

        A client's small append (chunk + commit) usually arrives whole: this takes it
        in one pass over the buffer, without decoding a header per frame.
        """
        p = self.protocol
        buf, first, n = p.buf, p.start, p.end
        if first == n:
            return None
        body_kind, body_header = body
        end_kind, end_header = end
        body_len, end_len = len(body_header), len(end_header)
        pos = first
        spans: list[tuple[int, int]] = []
        unpack = PREFIX.unpack_from
        while pos + PREFIX_SIZE <= n:
            length, kind, hlen = unpack(buf, pos)
            stop = pos + 4 + length
            head = pos + PREFIX_SIZE
            if stop > n or length > MAX_FRAME or hlen > length - 5:
                return None
            if kind == end_kind:
                if not spans or hlen != end_len or length != 5 + hlen \
                        or not buf.startswith(end_header, head):
                    return None
                with memoryview(buf) as view:  # copies out: no export outlives this block
                    payloads = [bytes(view[a:b]) for a, b in spans]
                p.consume(stop - first)
                return payloads
            if kind != body_kind or hlen != body_len or not 0 < length - 5 - hlen <= MAX_CHUNK \
                    or not buf.startswith(body_header, head):
                return None
            spans.append((head + hlen, stop))
            pos = stop
        return None

    def take_copies(self, frame: bytes) -> int:
        """How many copies of the encoded `frame` lead the buffer; they are consumed.
        A replica's acknowledgements are one constant frame, so a burst of them is
        counted with a few slice compares instead of being decoded one by one."""
        p = self.protocol
        buf, start = p.buf, p.start
        size = len(frame)
        fits = p.buffered // size
        if not fits or not buf.startswith(frame, start):
            return 0
        if buf[start:start + fits * size] != frame * fits:
            k = 1
            while k < fits and buf.startswith(frame, start + k * size):
                k += 1
            fits = k
        p.consume(fits * size)
        return fits

    async def read(self) -> Frame:
        """The next frame; one wake-up per frame (its prefix is checked as soon as it is
        here, so a hostile length is refused before its body is waited for).

        One coroutine level: the protocol's data future is awaited here, not through a
        coroutine of its own, and the buffer is not looked at before a prefix is in it
        (every client append and every frame a coordinator reads comes through here)."""
        p = self.protocol
        while True:
            if p.end - p.start >= PREFIX_SIZE:
                frame = self.read_buffered()
                if frame is not None:
                    return frame
            exc = p.exc
            if exc is not None:
                if isinstance(exc, ConnectionError):
                    raise caused(ConnectionClosed(str(exc) or type(exc).__name__), exc)
                raise exc  # (an ssl.SSLError, say)
            if p.eof or p.lost:  # a partial frame (or none) at EOF
                raise ConnectionClosed("connection closed by peer")
            await p.data_waiter()

    async def read_message(self, expect: type[M] | tuple[type, ...]) -> tuple[M, memoryview | bytes]:
        return self.expect(await self.read(), expect)

    @staticmethod
    def expect(frame: Frame, expect: type[M] | tuple[type, ...]) -> tuple[M, memoryview | bytes]:
        """A frame's (message, payload) if it is of the `expect`ed type; else ProtocolError."""
        if isinstance(frame.message, ErrorFrame):
            raise ProtocolError(f"peer error {frame.message.status.name}: {frame.message.message}")
        if not isinstance(frame.message, expect):
            raise ProtocolError(f"expected {expect}, got {type(frame.message).__name__}")
        return frame.message, frame.payload  # type: ignore[return-value]

    def write(self, message: Message, payload: bytes | memoryview = b"") -> None:
        """Queue one frame; it reaches the socket by the end of this loop iteration."""
        self.write_encoded(encode_frame(message, payload))

    def write_encoded(self, bufs: list[bytes | memoryview]) -> None:
        """Queue a frame already made by `encode_frame` (one encoding, many peers)."""
        self._out += bufs
        self._queued += sum(map(len, bufs))
        if self._queued >= FLUSH_BYTES:
            self.flush()
        elif not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._deferred_flush)

    def send_encoded(self, bufs: list[bytes | memoryview]) -> None:
        """Hand frames already made by `encode_frame` to the transport now, behind
        anything queued, in one writelines (no deferred flush is scheduled)."""
        if self._out or self.before_flush is not None:
            self._out += bufs
            self.flush()
        else:
            self._hand(bufs)

    def _deferred_flush(self) -> None:
        self._flush_pending = False
        if self._out:
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the connection is gone: reads and drain() report it
                pass

    def flush(self) -> None:
        """Hand every queued frame to the transport now (one writelines)."""
        out = self._out
        if out:
            self._out, self._queued = [], 0
            if self.before_flush is not None:
                try:
                    self.before_flush()
                except BaseException:
                    transport = self.transport
                    if transport is not None:
                        transport.abort()  # (not self.abort: nothing queued may leave)
                    raise
            self._hand(out)

    def _hand(self, bufs: list[bytes | memoryview]) -> None:
        """writelines, or nothing on a transport already closing: asyncio's drop what is
        written after close, uvloop's raise RuntimeError once the handle is closed (out of
        whatever wrote, a relay's flush in the middle of a read); drain() says it is gone."""
        t = self.transport
        if t is not None and not t.is_closing():
            t.writelines(bufs)

    async def send(self, message: Message, payload: bytes | memoryview = b"") -> None:
        self.write(message, payload)
        self.flush()
        await self.drain()

    def writable(self) -> bool:
        """drain() would return at once: the transport is open and below high water."""
        t = self.transport
        return t is not None and not t.is_closing() and t.get_write_buffer_size() <= self._high

    async def drain(self) -> None:
        """Wait while the transport is over its high-water mark; raise if it is lost (or
        closing: nothing written now would leave)."""
        t = self.transport
        if t is not None and not t.is_closing() and t.get_write_buffer_size() <= self._high:
            return
        if t is None or t.is_closing():
            self._out, self._queued = [], 0
            raise ConnectionClosed("connection closed")
        self.flush()
        try:
            await self.protocol.drain()
        except ConnectionError as exc:
            raise caused(ConnectionClosed(str(exc) or type(exc).__name__), exc)

    async def send_error(self, message: str, status: Status = Status.BAD_REQUEST) -> None:
        """Tell the peer why, if it can still hear it (on a closed connection the frame
        goes nowhere and the ConnectionClosed of drain() is swallowed)."""
        try:
            async with asyncio.timeout(1.0):
                await self.send(ErrorFrame(status=status, message=message[:1000]))
        except (ProtocolError, asyncio.TimeoutError, OSError):
            pass

    async def close(self) -> None:
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        if self.transport is None:
            return
        self.transport.close()
        try:
            async with asyncio.timeout(1.0):
                await self.protocol.wait_closed()
        except (OSError, asyncio.TimeoutError):
            pass

    def abort(self) -> None:
        transport = self.transport
        if transport is not None:
            try:
                self.flush()  # frames already written go out, as if unbuffered
            except Exception:  # noqa: BLE001
                pass
            transport.abort()
