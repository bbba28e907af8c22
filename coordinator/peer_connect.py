"""A handshaken connection to another coordinator (reads relayed, gaps filled, held
copies fetched, proxied appends)."""

from __future__ import annotations

import asyncio

from protocol import Hello, HelloAck
from protocol.errors import ProtocolError
from protocol.stream import FrameStream

from .proxy_rules import CONNECT_TIMEOUT

__all__ = ["connect_member"]


async def connect_member(endpoints, peer: dict,  # noqa: ANN001
                         timeout: float = CONNECT_TIMEOUT) -> FrameStream | None:
    """A handshaken connection to one of `endpoints` (any will do; one that is down, its
    lease not yet expired, is skipped), presenting our derived token; None if none
    answers. Each may take `timeout` to connect and as long again to answer Hello: a
    member whose host is isolated (a silent link) costs that, not the OS's timeout."""
    for endpoint in [e for e in endpoints if e]:
        upstream: FrameStream | None = None
        try:
            upstream = await FrameStream.connect(endpoint, timeout=timeout, ssl=peer.get("ssl"))
            await upstream.send(Hello(token=peer.get("token", "")))
            async with asyncio.timeout(2 * timeout):
                await upstream.read_message(HelloAck)
            return upstream
        except (OSError, ProtocolError, asyncio.TimeoutError):
            if upstream is not None:
                upstream.abort()
    return None
