"""The primary's pool of multiplexed replicate connections (protocol/mux.py): one per
(peer endpoint, TLS context), shared by every journal this coordinator replicates to
that peer, each journal's stream a channel of it.

`MuxPool.open` connects on first use (later callers wait for that one connection),
opens a channel and has its Hello answered. A connection left without channels stays
open LINGER seconds for the next one. A peer that answers Hello(mux=True) without `mux`
(an older coordinator, during a rolling upgrade) raises NotMultiplexed: the caller
connects per stream, as before, and the pool does not ask that peer again for
PLAIN_FOR seconds.
"""

from __future__ import annotations

import asyncio
from ssl import SSLContext

from .errors import ProtocolError
from .messages import Hello, HelloAck
from .mux import Channel, MuxConnection
from .stream import ConnectionClosed, FrameStream
from .wire import Frame

LINGER = 10.0
"""Seconds an idle pooled connection (no channel left) stays open for the next one."""
PLAIN_FOR = 60.0
"""Seconds a peer that answered without multiplexing (an older coordinator, during a
rolling upgrade) is not asked again: its streams take a connection each meanwhile."""


class NotMultiplexed(ProtocolError):
    """The peer answered Hello(mux=True) without mux: it serves one stream per
    connection (the caller connects as before)."""


class MuxPool:
    """The primary's multiplexed connections, one per (peer endpoint, TLS context)."""

    def __init__(self, constant: tuple[bytes, Frame], linger: float = LINGER) -> None:
        self.constant = constant
        self.linger = linger
        self._conns: dict[tuple[str, int], asyncio.Future[MuxConnection]] = {}
        self._timers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self._plain: dict[tuple[str, int], float] = {}
        """Peers that do not multiplex, until when we believe it."""

    def connections(self) -> list[MuxConnection]:
        return [f.result() for f in self._conns.values()
                if f.done() and not f.cancelled() and f.exception() is None]

    async def open(self, endpoint: str, *, token: str = "", ssl: SSLContext | None = None,
                   timeout: float = 5.0) -> Channel:
        """A new channel to `endpoint`, its Hello answered (a refused token raises
        ProtocolError, the connection unharmed); connects first if need be."""
        key = (endpoint, id(ssl))
        loop = asyncio.get_running_loop()
        if self._plain.get(key, 0.0) > loop.time():
            raise NotMultiplexed(f"{endpoint} does not multiplex replicate streams")
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        fut = self._conns.get(key)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None
                                           or fut.result().failed is not None)):
            fut = self._conns[key] = asyncio.get_running_loop().create_future()
            try:
                conn = await self._connect(key, endpoint, token, ssl, timeout)
            except BaseException as exc:
                if self._conns.get(key) is fut:
                    del self._conns[key]
                # Others waiting on this connection fail as a connection does (never
                # with our cancellation, which is not theirs).
                fut.set_exception(exc if isinstance(exc, Exception) else
                                  ConnectionClosed(f"connecting to {endpoint} was cancelled"))
                fut.exception()  # (retrieved: the waiters have their own)
                raise
            fut.set_result(conn)
        async with asyncio.timeout(timeout):
            conn = await asyncio.shield(fut)
            ch = conn.open_channel()
            try:
                await ch.send(Hello(token=token))
                await ch.read_message(HelloAck)
            except BaseException:
                ch.abort()
                raise
        return ch

    async def _connect(self, key: tuple[str, int], endpoint: str, token: str,
                       ssl: SSLContext | None, timeout: float) -> MuxConnection:
        stream = await FrameStream.connect(endpoint, timeout=timeout, ssl=ssl)
        try:
            async with asyncio.timeout(timeout):
                await stream.send(Hello(token=token, mux=True))
                ack, _ = await stream.read_message(HelloAck)
            if not ack.mux:
                self._plain[key] = asyncio.get_running_loop().time() + PLAIN_FOR
                raise NotMultiplexed(f"{endpoint} does not multiplex replicate streams")
        except BaseException:
            stream.abort()
            raise
        return MuxConnection(stream, self.constant, lambda c: self._idle(key, c))

    def _idle(self, key: tuple[str, int], conn: MuxConnection) -> None:
        fut = self._conns.get(key)
        if fut is None or not fut.done() or fut.exception() is not None or fut.result() is not conn:
            return
        if conn.failed is not None:
            del self._conns[key]
            return
        if conn.channels or key in self._timers:
            return

        def close() -> None:
            self._timers.pop(key, None)
            if not conn.channels and self._conns.get(key) is fut:
                del self._conns[key]
                conn.close()

        self._timers[key] = asyncio.get_running_loop().call_later(self.linger, close)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for conn in self.connections():
            conn.close()
        self._conns.clear()
