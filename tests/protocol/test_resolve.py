"""Name lookups of FrameStream.connect (protocol/resolve.py): a dead peer's name must not
take every resolver thread. In `make compose-test` the killed coordinator's name took
Docker's DNS 10 s to fail; each retry started another lookup, and the new primary's
lookup of its live replica queued behind them for ~40 s. The slow resolver is simulated
by the loop's getaddrinfo (a real one cannot be made slow on demand); the connects are
real, to a real listener on loopback."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from protocol import resolve as resolve_mod
from protocol.resolve import is_address, resolve
from protocol.stream import FrameStream


class SlowResolver:
    """The running loop's getaddrinfo, made to hang `delay` s for `dead` names and to
    fail them (as Docker's DNS does for a killed container); counts lookups per name."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dead: str, delay: float) -> None:
        self.loop, self.dead, self.delay = loop, dead, delay
        self.real = loop.getaddrinfo
        self.calls: dict[str, int] = {}

    async def __call__(self, host, port, *args, **kwargs):  # noqa: ANN001, ANN204
        self.calls[host] = self.calls.get(host, 0) + 1
        if host == self.dead:
            await asyncio.sleep(self.delay)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return await self.real(host, port, *args, **kwargs)

    def __enter__(self) -> SlowResolver:
        self.loop.getaddrinfo = self  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.loop.getaddrinfo  # (the instance attribute: the class's method again)
        resolve_mod._STATES.pop(self.loop, None)


async def _listener() -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_retries_of_a_dead_name_share_one_lookup_and_fail_fast_after_it() -> None:
    loop = asyncio.get_running_loop()
    with SlowResolver(loop, "dead-peer.invalid", delay=1.0) as r:
        t0 = time.monotonic()
        results = await asyncio.gather(*(FrameStream.connect("dead-peer.invalid:8080", timeout=0.2)
                                         for _ in range(20)), return_exceptions=True)
        assert all(isinstance(e, TimeoutError) for e in results)
        assert r.calls["dead-peer.invalid"] == 1  # 20 connects, one lookup in flight
        await asyncio.sleep(1.2)  # the lookup fails: remembered for NEGATIVE_TTL
        with pytest.raises(socket.gaierror):
            await FrameStream.connect("dead-peer.invalid:8080", timeout=5.0)
        assert r.calls["dead-peer.invalid"] == 1
        assert time.monotonic() - t0 < 5.0


async def test_a_live_name_resolves_while_a_dead_one_hangs() -> None:
    loop = asyncio.get_running_loop()
    server, port = await _listener()
    try:
        with SlowResolver(loop, "dead-peer.invalid", delay=2.0) as r:
            dead = [asyncio.ensure_future(FrameStream.connect("dead-peer.invalid:8080", timeout=0.1))
                    for _ in range(50)]
            stream = await FrameStream.connect(f"localhost:{port}", timeout=2.0)
            stream.abort()
            await asyncio.gather(*dead, return_exceptions=True)
            assert r.calls == {"dead-peer.invalid": 1, "localhost": 1}
    finally:
        server.close()
        await server.wait_closed()


async def test_a_failure_is_forgotten_after_its_ttl_and_answers_are_never_cached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve_mod, "NEGATIVE_TTL", 0.2)
    loop = asyncio.get_running_loop()
    with SlowResolver(loop, "dead-peer.invalid", delay=0.0) as r:
        for _ in range(2):
            with pytest.raises(socket.gaierror):
                await resolve("dead-peer.invalid", 1)
        assert r.calls["dead-peer.invalid"] == 1
        await asyncio.sleep(0.3)
        with pytest.raises(socket.gaierror):
            await resolve("dead-peer.invalid", 1)
        assert r.calls["dead-peer.invalid"] == 2
        await resolve("localhost", 1)
        await resolve("localhost", 1)
        assert r.calls["localhost"] == 2


def test_addresses_are_not_names() -> None:
    assert is_address("127.0.0.1") and is_address("::1") and is_address("[::1]")
    assert not is_address("coordinator-a1") and not is_address("localhost")
