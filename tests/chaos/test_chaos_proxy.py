"""The fault-injecting proxy, with real sockets on loopback.

Every wait is bounded; the timing checks only assert lower bounds (a delay held data at
least this long) or outcomes, never how fast something ran.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from chaos.proxy import Fault, FaultMode, FaultProxy

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="session")]


class Upstream:
    """Echo server that also records every read it did."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.received = bytearray()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(1 << 16):
                self.reads.append(data)
                self.received += data
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def start(self) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Upstream, FaultProxy]]:
    up = await Upstream().start()
    proxy = await FaultProxy("test", f"127.0.0.1:{up.port}", seed=7).start()
    try:
        yield up, proxy
    finally:
        await proxy.close()
        await up.close()


async def _connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", proxy.port), 5)


async def test_pass_forwards_both_ways(pair: tuple[Upstream, FaultProxy]) -> None:
    up, proxy = pair
    r, w = await _connect(proxy)
    payload = os.urandom(300_000)
    reading = asyncio.ensure_future(r.readexactly(len(payload)))
    w.write(payload)
    await asyncio.wait_for(w.drain(), 10)
    echoed = await asyncio.wait_for(reading, 10)
    assert echoed == payload
    assert bytes(up.received) == payload
    w.close()
    assert proxy.stats.accepted == 1
    assert proxy.stats.bytes_up == len(payload)


async def test_delay_holds_every_chunk(pair: tuple[Upstream, FaultProxy]) -> None:
    _, proxy = pair
    proxy.set_fault(Fault(FaultMode.DELAY, delay=0.2, jitter=0.05))
    r, w = await _connect(proxy)
    t0 = time.monotonic()
    w.write(b"ping")
    echoed = await asyncio.wait_for(r.readexactly(4), 10)
    # Up and down are each delayed by >= 0.2 s.
    assert echoed == b"ping"
    assert time.monotonic() - t0 >= 0.4
    w.close()


async def test_delay_keeps_order(pair: tuple[Upstream, FaultProxy]) -> None:
    _, proxy = pair
    proxy.set_fault(Fault(FaultMode.DELAY, delay=0.01, jitter=0.05))
    r, w = await _connect(proxy)
    expected = b"".join(i.to_bytes(4, "big") for i in range(200))
    for i in range(200):
        w.write(i.to_bytes(4, "big"))
        await w.drain()
        await asyncio.sleep(0)
    assert await asyncio.wait_for(r.readexactly(len(expected)), 20) == expected
    w.close()


async def test_blackhole_stalls_then_heal_delivers(pair: tuple[Upstream, FaultProxy]) -> None:
    up, proxy = pair
    r, w = await _connect(proxy)
    proxy.set_fault(Fault(FaultMode.BLACKHOLE))
    w.write(b"hello")
    await w.drain()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(r.readexactly(5), 0.3)
    assert up.received == b""
    # A new connection is accepted but stalls as well.
    r2, w2 = await _connect(proxy)
    w2.write(b"x")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(r2.readexactly(1), 0.2)
    proxy.heal()
    assert await asyncio.wait_for(r.readexactly(5), 5) == b"hello"
    assert await asyncio.wait_for(r2.readexactly(1), 5) == b"x"
    w.close()
    w2.close()


async def test_one_way_cuts_only_the_return_path(pair: tuple[Upstream, FaultProxy]) -> None:
    up, proxy = pair
    r, w = await _connect(proxy)
    proxy.set_fault(Fault(FaultMode.ONE_WAY, direction="down"))
    w.write(b"abc")
    await w.drain()
    for _ in range(100):
        if up.received == b"abc":
            break
        await asyncio.sleep(0.02)
    assert up.received == b"abc"  # request got through
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(r.readexactly(3), 0.3)  # answer did not
    proxy.heal()
    assert await asyncio.wait_for(r.readexactly(3), 5) == b"abc"
    w.close()


async def test_one_way_up_cuts_requests(pair: tuple[Upstream, FaultProxy]) -> None:
    up, proxy = pair
    r, w = await _connect(proxy)
    proxy.set_fault(Fault(FaultMode.ONE_WAY, direction="up"))
    w.write(b"abc")
    await w.drain()
    await asyncio.sleep(0.3)
    assert up.received == b""
    proxy.heal()
    assert await asyncio.wait_for(r.readexactly(3), 5) == b"abc"
    w.close()


async def test_reset_aborts_live_and_new_connections(pair: tuple[Upstream, FaultProxy]) -> None:
    _, proxy = pair
    r, w = await _connect(proxy)
    w.write(b"a")
    assert await asyncio.wait_for(r.readexactly(1), 5) == b"a"
    proxy.set_fault(Fault(FaultMode.RESET))
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r.readexactly(1), 5)
    r2, w2 = await _connect(proxy)
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r2.readexactly(1), 5)
    assert proxy.stats.resets >= 2
    proxy.heal()
    r3, w3 = await _connect(proxy)
    w3.write(b"ok")
    assert await asyncio.wait_for(r3.readexactly(2), 5) == b"ok"
    for x in (w, w2, w3):
        x.close()


async def test_slice_splits_writes_but_keeps_bytes(pair: tuple[Upstream, FaultProxy]) -> None:
    up, proxy = pair
    proxy.set_fault(Fault(FaultMode.SLICE, slice_max=3))
    r, w = await _connect(proxy)
    payload = os.urandom(600)
    writes_before = proxy.stats.writes
    w.write(payload)
    await w.drain()
    assert await asyncio.wait_for(r.readexactly(len(payload)), 10) == payload
    assert bytes(up.received) == payload
    # Both directions went out in pieces of at most 3 bytes.
    assert proxy.stats.writes - writes_before >= 2 * len(payload) // 3
    w.close()


async def test_upstream_down_refuses(pair: tuple[Upstream, FaultProxy]) -> None:
    up, proxy = pair
    await up.close()
    assert up.server is not None
    await up.server.wait_closed()
    r, w = await _connect(proxy)
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r.readexactly(1), 5)
    assert proxy.stats.upstream_failures == 1
    w.close()


async def test_fault_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        Fault(FaultMode.ONE_WAY, direction="sideways")
    with pytest.raises(ValueError):
        Fault(FaultMode.DELAY, delay=-1)
    assert Fault(FaultMode.BLACKHOLE).blocks("up") and Fault(FaultMode.BLACKHOLE).blocks("down")
    assert Fault(FaultMode.ONE_WAY, direction="up").blocks("up")
    assert not Fault(FaultMode.ONE_WAY, direction="up").blocks("down")
