"""The receive side of one frame connection: an asyncio BufferedProtocol that owns its
read buffer, so the transport reads — and TLS decrypts — straight into it.

asyncio's StreamReader is handed each read as a new bytes object and copies it onto its
buffer. Over TLS the SSL layer (uvloop's and asyncio's alike) also reads every record
(16 KiB at most) into a fresh 256 KiB bytes object and joins them before the StreamReader
copies the result again (`python -m bench.recv` measures the difference: docs/
benchmarks.md, "One connection's receive path"). A BufferedProtocol is asked for that buffer: the kernel (plain TCP) or OpenSSL (TLS) writes
into it, and stream.py decodes frames out of it where they lie.

Layout: `buf[start:end]` holds the bytes received and not yet consumed; `buf[end:]` is
room for the next read. Only `get_buffer` moves or grows the bytearray (to ROOMY the first
time room runs short, then sliding the unconsumed bytes to the front, or extending it
for a frame that does not fit): no view of it is alive then. The view
it returns may still be held by the transport when `buffer_updated` runs, so that only
advances `end`, and `consume` only advances `start`.

Flow control as StreamReader's: reading pauses while over 2 × `limit` bytes wait
unconsumed and resumes once `consume` brings them to `limit` or less; `drain` waits
while the transport is over its write high-water mark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

READ_ROOM = 1 << 16
"""The least free room offered to one read, and a new connection's buffer."""
ROOMY = 1 << 20
"""What the buffer grows to the first time a read finds too little room: frames larger
than a read then cost a slide of their partial tail once per ~ROOMY bytes, not per read."""
SHRINK_ABOVE = ROOMY
"""An empty buffer larger than this (grown for a frame bigger than ROOMY) goes back to
READ_ROOM — one large frame must not keep megabytes per idle connection — unless it was
filled past this size within its last KEEP_BIG emptyings: a connection that large frames
keep coming to (empty between them, or between them and the small frames around them)
keeps its room instead of growing it again per frame, each regrowth zeroing and copying
megabytes (docs/benchmarks.md, round 10)."""
KEEP_BIG = 16
"""Emptyings without a large fill after which a large buffer shrinks."""


class FrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, limit: int = 1 << 21,
                 on_connected: Callable[[FrameProtocol], Any] | None = None) -> None:
        self.buf = bytearray(READ_ROOM)
        self._keep_big = 0
        """Emptyings left before a large buffer shrinks (KEEP_BIG after a large fill)."""
        self.start = 0
        self.end = 0
        self.limit = limit
        self.transport: Any = None
        """The transport (asyncio's or uvloop's: `Any`, since uvloop's transports are not
        asyncio.Transport instances and compiled code checks declared types)."""
        self.exc: BaseException | None = None
        """Why the connection was lost, if not cleanly (reads raise it once drained)."""
        self.eof = False
        self.lost = False
        self._on_connected = on_connected
        self._over_ssl = False
        self._reading_paused = False
        self._writing_paused = False
        self._data_waiter: asyncio.Future[None] | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed: asyncio.Future[None] | None = None
        self.task: Any = None
        """What `on_connected` returned (a server's handler task), kept alive here."""
        self.on_data: Callable[[], None] | None = None
        """Called, when set, as bytes, EOF or the loss of the connection arrive (before
        any waiting reader wakes): a multiplexed connection (protocol/mux.py) dispatches
        the frames it completes right there, with no task switch per frame."""

    # -- the transport's calls --------------------------------------------------------

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self.transport = transport
        self._over_ssl = transport.get_extra_info("sslcontext") is not None
        if self._on_connected is not None:
            self.task = self._on_connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        room = max(sizehint, READ_ROOM)
        buf = self.buf
        if self.start == self.end:
            self.start = self.end = 0
            if len(buf) > SHRINK_ABOVE and room < SHRINK_ABOVE:
                if self._keep_big:  # filled big lately: large frames keep coming
                    self._keep_big -= 1
                else:
                    self.buf = buf = bytearray(max(room, READ_ROOM))
        if len(buf) - self.end < room and len(buf) < ROOMY:
            buf.extend(bytes(ROOMY - len(buf)))
        if len(buf) - self.end < room:
            held = self.end - self.start
            if self.start:
                with memoryview(buf) as view:
                    view[:held] = view[self.start:self.end]
                self.start, self.end = 0, held
            if len(buf) - held < room:
                buf.extend(bytes(max(held + room, 2 * len(buf)) - len(buf)))
        return memoryview(buf)[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        if self.end > SHRINK_ABOVE:
            self._keep_big = KEEP_BIG
        if self.on_data is not None:
            self.on_data()
        self._wake()
        if not self._reading_paused and self.end - self.start > 2 * self.limit:
            self._pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        if self.on_data is not None:
            self.on_data()
        self._wake()
        return not self._over_ssl  # (plain TCP: we may still write; TLS closes anyway)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if exc is None:
            self.eof = True
        elif self.exc is None:
            self.exc = exc
        if self.on_data is not None:
            self.on_data()
        self._wake()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(exc if exc is not None
                                     else ConnectionResetError("Connection lost"))
        self._drain_waiters.clear()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # -- the reader's calls -----------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        return self.end - self.start

    def unconsumed(self) -> bytes:
        return bytes(self.buf[self.start:self.end])

    def consume(self, n: int) -> None:
        self.start += n
        if self.start == self.end:
            self.start = self.end = 0
        if self._reading_paused and self.end - self.start <= self.limit:
            self._resume_reading()

    def data_waiter(self) -> asyncio.Future[None]:
        """A future done when more bytes, EOF or the loss of the connection arrive: the
        reader awaits it itself (FrameStream.read), with no coroutine level of ours
        between. One reader at a time: a second, while the first waits, is an error."""
        waiter = self._data_waiter
        if waiter is not None and not waiter.done():
            raise RuntimeError("another coroutine is already waiting for this connection's data")
        if self._reading_paused:  # (a waiting reader wants more than is buffered)
            self._resume_reading()
        waiter = self._data_waiter = asyncio.get_running_loop().create_future()
        return waiter

    async def wait_for_data(self) -> None:
        """Until more bytes, EOF or the loss of the connection arrive."""
        await self.data_waiter()

    def feed(self, data: bytes) -> None:
        """Deliver `data` as a transport's read would (tests, in-process pipes)."""
        view = self.get_buffer(len(data))
        view[:len(data)] = data
        del view
        self.buffer_updated(len(data))

    # -- the writer's calls -----------------------------------------------------------

    async def drain(self) -> None:
        """Wait while the transport is paused for writing; ConnectionResetError once lost."""
        if self.lost:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    async def wait_closed(self) -> None:
        if self.lost:
            return
        if self._closed is None:
            self._closed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._closed)

    def _wake(self) -> None:
        waiter = self._data_waiter
        if waiter is not None:
            self._data_waiter = None
            if not waiter.done():  # (cancelled: its reader was)
                waiter.set_result(None)

    def _resume_reading(self) -> None:
        self._reading_paused = False
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def _pause_reading(self) -> None:
        try:
            self.transport.pause_reading()
        except (AttributeError, NotImplementedError):
            return  # (a transport that cannot pause: the buffer just grows)
        self._reading_paused = True
