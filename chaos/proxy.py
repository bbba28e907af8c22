"""A fault-injecting TCP proxy for one directed link (asyncio, loopback, no root).

Theory of operation
-------------------
A `FaultProxy` listens on its own port and forwards every accepted connection to one
upstream `host:port`. Each connection has two directions, *up* (the connecting side to
the upstream) and *down* (back). Each direction is a reader task that puts chunks on a
bounded queue and a writer task that takes them off, so a stalled direction applies
back-pressure exactly like a full TCP window: nothing is ever dropped from the middle
of a stream, because a real network never does that to a TCP byte stream either.

The current `Fault` is read by the writer for every chunk, so a change takes effect
at once on live connections:

    PASS        forward as is
    DELAY       hold each chunk until arrival + delay (+ seeded jitter); order is kept
    BLACKHOLE   accept and read, never forward (both directions) until healed
    ONE_WAY     like BLACKHOLE but only for `direction` ("up" or "down")
    RESET       every live connection is aborted with an RST (SO_LINGER 0), and new
                connections are reset as soon as they are accepted
    SLICE       forward in writes of 1..`slice_max` bytes, draining between writes, so
                the receiver sees frames split at every possible byte boundary

Faults are set and healed by the chaos runner (`set_fault`, `heal`); every change is
logged with structlog and counted in `stats`.
"""

from __future__ import annotations

import asyncio
import enum
import random
import socket
import struct
import time
from dataclasses import dataclass, field

import structlog

__all__ = ["FaultMode", "Fault", "FaultProxy", "ProxyStats", "PASS"]

log = structlog.get_logger("chaos.proxy")

_CHUNK = 1 << 16
_QUEUE_CHUNKS = 64  # at most ~4 MiB buffered per direction


class FaultMode(str, enum.Enum):
    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    ONE_WAY = "one-way"
    RESET = "reset"
    SLICE = "slice"


@dataclass(frozen=True)
class Fault:
    mode: FaultMode = FaultMode.PASS
    delay: float = 0.0
    """Seconds added to every chunk (DELAY)."""
    jitter: float = 0.0
    """Up to this many extra seconds per chunk, seeded (DELAY)."""
    direction: str = "down"
    """The direction that is cut (ONE_WAY): "up" = towards the upstream."""
    slice_max: int = 7
    """Largest write in SLICE mode."""

    def __post_init__(self) -> None:
        if self.direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {self.direction!r}")
        if self.delay < 0 or self.jitter < 0 or self.slice_max < 1:
            raise ValueError(f"invalid fault parameters {self!r}")

    def blocks(self, direction: str) -> bool:
        if self.mode is FaultMode.BLACKHOLE:
            return True
        return self.mode is FaultMode.ONE_WAY and self.direction == direction


PASS = Fault()


@dataclass
class ProxyStats:
    accepted: int = 0
    upstream_failures: int = 0
    resets: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    writes: int = 0
    faults: dict[str, int] = field(default_factory=dict)


def _rst(writer: asyncio.StreamWriter) -> None:
    """Abort with a TCP RST rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Link:
    """One proxied connection: two directions, each a reader and a writer task."""

    def __init__(self, proxy: FaultProxy, cr: asyncio.StreamReader, cw: asyncio.StreamWriter,
                 ur: asyncio.StreamReader, uw: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client_w, self.upstream_w = cw, uw
        self.tasks = [
            asyncio.ensure_future(self._direction("up", cr, uw)),
            asyncio.ensure_future(self._direction("down", ur, cw)),
        ]

    async def _direction(self, name: str, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
        pump = asyncio.ensure_future(self._read(reader, queue))
        try:
            await self._write(name, queue, writer)
        except (ConnectionError, OSError):
            self.abort()
        finally:
            pump.cancel()

    async def _read(self, reader: asyncio.StreamReader,
                    queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                await queue.put((time.monotonic(), data))
                if not data:
                    return
        except (ConnectionError, OSError):
            # A reset on one side is passed on as a reset on the other.
            self.abort(rst=True)

    async def _write(self, name: str, queue: asyncio.Queue[tuple[float, bytes]],
                     writer: asyncio.StreamWriter) -> None:
        proxy = self.proxy
        last_due = 0.0
        while True:
            arrived, data = await queue.get()
            while proxy.fault.blocks(name):
                await proxy.wait_change()
            fault = proxy.fault
            if fault.mode is FaultMode.DELAY:
                due = max(last_due, arrived + fault.delay + proxy.rng.uniform(0, fault.jitter))
                last_due = due
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            if fault.mode is FaultMode.SLICE:
                view = memoryview(data)
                while view:
                    n = proxy.rng.randint(1, fault.slice_max)
                    writer.write(view[:n])
                    view = view[n:]
                    proxy.stats.writes += 1
                    await writer.drain()
            else:
                writer.write(data)
                proxy.stats.writes += 1
                await writer.drain()
            if name == "up":
                proxy.stats.bytes_up += len(data)
            else:
                proxy.stats.bytes_down += len(data)

    async def run(self) -> None:
        try:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            for w in (self.client_w, self.upstream_w):
                w.close()

    def abort(self, rst: bool = False) -> None:
        for w in (self.client_w, self.upstream_w):
            if rst:
                _rst(w)
            else:
                w.transport.abort()
        for t in self.tasks:
            t.cancel()


class FaultProxy:
    """Listen on `listen_port` (0 = pick one) and forward to `upstream` ("host:port")."""

    def __init__(self, name: str, upstream: str, *, listen_port: int = 0, seed: int = 0,
                 host: str = "127.0.0.1") -> None:
        self.name = name
        uhost, _, uport = upstream.rpartition(":")
        self.upstream = (uhost or "127.0.0.1", int(uport))
        self.host = host
        self.port = listen_port
        self.rng = random.Random(seed)
        self.fault: Fault = PASS
        self.stats = ProxyStats()
        self._changed = asyncio.Event()
        self._links: set[_Link] = set()
        self._server: asyncio.base_events.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port,
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        log.debug("proxy.start", proxy=self.name, listen=self.endpoint, upstream=self.upstream)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass
        self._server = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- faults ---------------------------------------------------------------------

    def set_fault(self, fault: Fault) -> None:
        self.fault = fault
        if fault.mode is not FaultMode.PASS:
            self.stats.faults[fault.mode.value] = self.stats.faults.get(fault.mode.value, 0) + 1
        log.info("proxy.fault", proxy=self.name, mode=fault.mode.value, delay=fault.delay,
                 direction=fault.direction, links=len(self._links))
        if fault.mode is FaultMode.RESET:
            for link in list(self._links):
                link.abort(rst=True)
                self.stats.resets += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def heal(self) -> None:
        self.set_fault(PASS)

    async def wait_change(self) -> None:
        await self._changed.wait()

    # -- connections ----------------------------------------------------------------

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if self.fault.mode is FaultMode.RESET:
            self.stats.resets += 1
            _rst(cw)
            return
        try:
            ur, uw = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5.0)
        except (OSError, asyncio.TimeoutError):
            # The upstream is down (killed coordinator): refuse like it would.
            self.stats.upstream_failures += 1
            _rst(cw)
            return
        for w in (cw, uw):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(self, cr, cw, ur, uw)
        self._links.add(link)
        try:
            await link.run()
        finally:
            self._links.discard(link)
