"""Connections to coordinators and a small pool of them per endpoint.

A connection opens with Hello -> HelloAck and then carries one RPC at a time, so a
connection is *leased* for exactly one RPC and handed back only if that RPC ended on a
frame boundary (a clean response). Anything else — an error mid-stream, a cancelled
read — closes it, because the peer may still be sending frames of the old RPC.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from ssl import SSLContext
from typing import Protocol

from protocol import PROTOCOL_VERSION, ErrorFrame, Hello, HelloAck, Message
from protocol.credentials import TokenSource, current_token, unverified_expiry
from protocol.errors import ProtocolError, StatusError, Unavailable, caused, for_status
from protocol.status import Status
from protocol.stream import ConnectionClosed, FrameStream
from protocol.tls import handshake_refusal
from protocol.wire import Frame

from .retry import Rerouted

WATCH_PERIOD = 1.0
"""Seconds between the watchdog's checks of overdue RPCs (ConnectionPool.watch)."""


class Connection:
    """One FrameStream after a successful hello."""

    def __init__(self, endpoint: str, stream: FrameStream) -> None:
        self.endpoint = endpoint
        self.stream = stream
        self.broken = False
        self.expires: float | None = None
        """When the token it was opened with expires: it is not reused past that (the
        coordinator would refuse it), so the pool opens one with the current token."""
        self.deadline = 0.0
        """While watched (ConnectionPool.watch): when its RPC's answer is overdue."""
        self.timed_out = 0.0
        """The RPC timeout that closed it (the watchdog's doing), else 0."""
        # While an append is watched (reroute.py): its journal, when it was sent, the
        # primary it expects to answer, how long it may wait once the journal moved,
        # and where (and when) a probe saw the journal move; `rerouted` once aborted.
        self.journal = ""
        self.since = 0.0
        self.expect = ""
        self.grace = 0.0
        self.moved_to = ""
        self.moved_at = 0.0
        self.rerouted = ""

    @classmethod
    async def open(cls, endpoint: str, timeout: float, token: TokenSource = "",
                   ssl: SSLContext | None = None) -> Connection:
        """Connect and say Hello, presenting `token` (a refused one raises Unauthorized);
        a callable token source is asked for the current token at each connection."""
        token = current_token(token)
        expires = unverified_expiry(token)
        try:
            stream = await FrameStream.connect(endpoint, timeout=timeout, ssl=ssl)
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            refused = handshake_refusal(exc, ssl, at_hello=False)
            if refused is not None:  # the reason (with the variable to set) is the cause
                raise caused(Unavailable(f"cannot connect to {endpoint}: {refused}"), refused)
            raise caused(Unavailable(f"cannot connect to {endpoint}: {exc or type(exc).__name__}"), exc)
        conn = cls(endpoint, stream)
        try:
            await asyncio.wait_for(stream.send(Hello(version=PROTOCOL_VERSION, token=token)), timeout)
            frame = await asyncio.wait_for(stream.read(), timeout)
        except (ProtocolError, OSError, asyncio.TimeoutError) as failed:
            conn.abort()
            refused = handshake_refusal(failed, ssl, at_hello=True)
            if refused is not None:
                raise caused(Unavailable(f"hello to {endpoint} failed: {refused}"), refused)
            raise caused(Unavailable(f"hello to {endpoint} failed: {failed or type(failed).__name__}"), failed)
        if isinstance(frame.message, ErrorFrame):
            conn.abort()
            raise for_status(frame.message.status)(f"{endpoint} refused hello: {frame.message.message}")
        if not isinstance(frame.message, HelloAck):
            conn.abort()
            raise ProtocolError(f"{endpoint} answered hello with {type(frame.message).__name__}")
        conn.expires = expires
        return conn

    async def send(self, message: Message, payload: bytes | memoryview = b"") -> None:
        try:
            await self.stream.send(message, payload)
        except (ConnectionClosed, OSError) as exc:
            self.broken = True
            raise caused(Unavailable(f"connection to {self.endpoint} lost while sending: {exc}"), exc)

    def write(self, message: Message, payload: bytes | memoryview = b"") -> None:
        """Queue a frame without draining (the caller drains)."""
        try:
            self.stream.write(message, payload)
        except (ConnectionError, OSError, RuntimeError) as exc:
            self.broken = True
            raise caused(Unavailable(f"connection to {self.endpoint} lost while sending: {exc}"), exc)

    async def drain(self) -> None:
        try:
            await self.stream.drain()
        except (ConnectionClosed, OSError) as exc:
            self.broken = True
            raise caused(Unavailable(f"connection to {self.endpoint} lost while sending: {exc}"), exc)

    async def read(self, timeout: float | None = None) -> Frame:
        """The next frame; an ErrorFrame from the peer becomes its typed StatusError."""
        try:
            if timeout is None:
                frame = await self.stream.read()
            else:
                # asyncio.timeout, not wait_for: no task per read (wait_for wraps the
                # read in one on Python 3.11), only a timer handle.
                async with asyncio.timeout(timeout):
                    frame = await self.stream.read()
        except ConnectionClosed as exc:
            raise caused(self.lost(exc, self.timed_out), exc)  # (the watchdog may have closed it)
        except asyncio.TimeoutError as expired:
            raise caused(self.lost(expired, timeout), expired)
        except ProtocolError:
            self.broken = True
            raise
        return self.checked(frame)

    def lost(self, exc: BaseException, timed_out: float | None = 0.0) -> Unavailable:
        """The Unavailable (or Rerouted) to raise for a read that found it closed; a watched
        RPC (ConnectionPool.watch, no timer) passes `timed_out`, set if the watchdog
        closed it (Client._append_whole reads its answer so)."""
        self.broken = True
        if self.rerouted:
            return Rerouted(f"{self.endpoint} did not answer for {time.monotonic() - self.since:.1f}s "
                            f"and the journal's primary moved to {self.rerouted}")
        if timed_out:
            return Unavailable(f"{self.endpoint} did not answer within {timed_out:g}s")
        return Unavailable(f"connection to {self.endpoint} closed: {exc}")

    def checked(self, frame: Frame) -> Frame:
        """`frame`, unless it is the peer's ErrorFrame: then its typed StatusError."""
        if isinstance(frame.message, ErrorFrame):
            self.broken = True
            raise for_status(frame.message.status)(f"{self.endpoint}: {frame.message.message}")
        return frame

    def abort(self) -> None:
        self.broken = True
        self.stream.abort()

    async def close(self) -> None:
        self.broken = True
        await self.stream.close()


class Rerouting(Protocol):
    """What the pool's watchdog asks of reroute.Rerouter."""

    period: float

    def tick(self, now: float, watched: dict[Connection, float]) -> bool: ...

    def close(self) -> None: ...


class ConnectionPool:
    """Idle connections per endpoint, at most `max_idle` kept per endpoint: as many as a
    client keeps RPCs in flight to one coordinator, so a burst of concurrent appends
    finds the connections the last one opened (an idle one costs a socket and a waiting
    task on the coordinator)."""

    def __init__(self, *, connect_timeout: float = 5.0, max_idle: int = 64, token: TokenSource = "",
                 ssl: SSLContext | None = None) -> None:
        self.connect_timeout = connect_timeout
        self.token = token
        self.ssl = ssl
        self.max_idle = max_idle
        self._idle: dict[str, list[Connection]] = {}
        self._closed = False
        self._watched: dict[Connection, float] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._period = WATCH_PERIOD
        self.rerouter: Rerouting | None = None
        """Set by the client: stalled appends whose journal moved are aborted (reroute.py)."""

    def take(self, endpoint: str) -> Connection | None:
        """An idle connection to `endpoint`, if one is pooled (no coroutine)."""
        if self._closed:
            raise Unavailable("client is closed")
        idle = self._idle.get(endpoint)
        while idle:
            conn = idle.pop()
            # Not stale: the peer closed an idle connection (coordinator restart, idle
            # timeout) and the reader has already seen EOF (or unasked-for bytes wait
            # unread: not an answer to the next RPC), or its token expires (the
            # coordinator would refuse it). Detecting it here keeps a dead pooled
            # connection from turning a safe append into an ambiguous one.
            if not (conn.broken or not conn.stream.reusable()
                    or (conn.expires is not None and conn.expires <= time.time() + 1.0)):
                return conn
            conn.abort()
        return None

    async def acquire(self, endpoint: str) -> Connection:
        conn = self.take(endpoint)
        if conn is not None:
            return conn
        return await Connection.open(endpoint, self.connect_timeout, self.token, self.ssl)

    # -- RPC deadlines without a timer per RPC ---------------------------------------

    def watch(self, conn: Connection, timeout: float, journal: str = "", expect: str = "",
              grace: float = 0.0) -> None:
        """Bound the RPC `conn` is about to wait on by `timeout`: one watchdog task per
        pool, waking every WATCH_PERIOD (or a quarter of the shortest timeout) while
        any RPC is watched, closes a connection whose answer is overdue — its read then
        raises Unavailable (Connection.lost). No timer handle per RPC: a timeout
        fires between `timeout` and `timeout` + the period.

        An append names its `journal`, the primary it `expect`s to answer ("" when sent
        to a proxy) and its `grace`: if it stalls and the journal moves, the rerouter
        closes it sooner, and its read raises Rerouted (reroute.py)."""
        self.send_watched(conn, None, timeout, journal, expect, grace)

    def unwatch(self, conn: Connection) -> None:
        self._watched.pop(conn, None)

    def send_watched(self, conn: Connection, frames: list[bytes | memoryview] | None,
                     timeout: float, journal: str = "", expect: str = "", grace: float = 0.0,
                     now: float = 0.0) -> None:
        """`conn.send_encoded(frames)` (if any), then watch(conn, timeout, journal, expect,
        grace), in one call: the small-append path's (bench/calls.py counts its calls).
        `now`: the caller's monotonic clock reading, if it has a fresh one."""
        if frames is not None:
            try:
                conn.stream.send_encoded(frames)
            except (ConnectionError, OSError, RuntimeError) as exc:
                conn.broken = True
                raise caused(Unavailable(f"connection to {conn.endpoint} lost while sending: {exc}"), exc)
        self._watched[conn] = timeout
        if not now:
            now = time.monotonic()
        conn.deadline = now + timeout
        conn.journal, conn.since, conn.expect, conn.grace = journal, now, expect, grace
        conn.moved_to = ""
        if timeout / 4 < self._period:
            self._period = max(0.01, timeout / 4)
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    def finish(self, conn: Connection) -> None:
        """`unwatch(conn)` then `release(conn)`, in one call (the small-append path's)."""
        self._watched.pop(conn, None)
        if conn.broken or self._closed:
            conn.abort()
            return
        idle = self._idle.get(conn.endpoint)
        if idle is None:
            self._idle[conn.endpoint] = [conn]
        elif len(idle) >= self.max_idle:
            conn.abort()
        else:
            idle.append(conn)

    async def _watch(self) -> None:
        try:
            stalled = False
            while self._watched:
                # Faster while an append is stalled (its journal may have moved).
                await asyncio.sleep(min(self._period, self.rerouter.period)
                                    if stalled and self.rerouter is not None else self._period)
                now = time.monotonic()
                for conn in [c for c in self._watched if c.deadline <= now]:
                    conn.timed_out = self._watched.pop(conn)
                    conn.abort()
                if self.rerouter is not None:
                    stalled = self.rerouter.tick(now, self._watched)
        finally:
            self._watchdog = None

    def release(self, conn: Connection) -> None:
        """Pool `conn` for the next RPC (unless it is broken or the pool is full)."""
        self.finish(conn)

    def lease(self, endpoint: str) -> Lease:
        """A connection for one RPC (`async with pool.lease(endpoint) as conn`). It returns
        to the pool only if the body finished without an exception; the body marks it
        broken if the RPC ended mid-stream."""
        return Lease(self, endpoint)

    def drop(self, endpoint: str) -> None:
        """Forget every idle connection to an endpoint (it failed us)."""
        for conn in self._idle.pop(endpoint, []):
            conn.abort()

    async def close(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.rerouter is not None:
            self.rerouter.close()
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.close()


class Lease:
    """`ConnectionPool.lease`'s context (a class, not an async generator: mypyc compiles
    this module, docs/compiled.md)."""

    __slots__ = ("pool", "endpoint", "conn")

    def __init__(self, pool: ConnectionPool, endpoint: str) -> None:
        self.pool = pool
        self.endpoint = endpoint
        self.conn: Connection | None = None

    async def __aenter__(self) -> Connection:
        self.conn = await self.pool.acquire(self.endpoint)
        return self.conn

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        conn, self.conn = self.conn, None
        assert conn is not None
        if exc is not None or kind is not None:
            conn.abort()
        else:
            self.pool.release(conn)


def status_error(status: Status, message: str, journal: str = "") -> StatusError:
    return for_status(status)(message, journal=journal)
