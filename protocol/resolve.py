"""Name lookups for FrameStream.connect: one lookup of a name at a time, and a failed
one remembered for a moment.

`getaddrinfo` runs on a thread — asyncio's default executor (6 workers on 2 cores) or,
under uvloop, libuv's pool (4 threads) — and a connect timeout abandons the *await*,
not the thread. A name the resolver cannot answer quickly keeps its thread for as long
as the resolver takes: Docker's embedded DNS, asked for a container that was killed,
forwards to servers the compose network cannot reach and fails after 10 s. A
coordinator retrying such a dead peer (its pipelines' pulses, proxied appends, each
attempt a new connect, each abandoned at its 5 s timeout) filled every resolver thread
with lookups of that one name, and the lookup of a *live* peer queued behind them: in
`make compose-test` the new primary could not connect to its new replica for ~40 s
after the failover ("connecting to peers of [coord-a2, *coord-b1]: TimeoutError()"),
62 s from the kill to the next append instead of ~21 s; the client's own connects
queued the same way behind its route probes' lookups of the dead name.

So, per event loop:

* a lookup of (host, port) in flight is shared by every connect to it (each waits for
  it within its own timeout; none starts another thread for the same name);
* a lookup that failed is remembered for NEGATIVE_TTL seconds: a connect in that
  window fails at once with the same error (a dead peer costs one thread per
  NEGATIVE_TTL + the resolver's time, however often it is retried);
* an answer is not cached: the next connect asks again (a container restarted may
  come back at another address).

Addresses (IPv4, IPv6 literals) are never looked up.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
import weakref
from typing import Any

__all__ = ["NEGATIVE_TTL", "is_address", "resolve"]

NEGATIVE_TTL = 2.0
"""Seconds a failed lookup of a name is answered from memory."""

AddrInfo = tuple[Any, ...]
"""One getaddrinfo row: (family, type, proto, canonname, sockaddr)."""


class _State:
    __slots__ = ("failed", "inflight")

    def __init__(self) -> None:
        self.inflight: dict[tuple[str, int], asyncio.Future[list[AddrInfo]]] = {}
        self.failed: dict[tuple[str, int], tuple[float, OSError]] = {}


_STATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _State] = weakref.WeakKeyDictionary()


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _state(loop: asyncio.AbstractEventLoop) -> _State:
    state = _STATES.get(loop)
    if state is None:
        state = _STATES[loop] = _State()
    return state


async def resolve(host: str, port: int) -> list[AddrInfo]:
    """The addresses of `host` for a TCP connect to `port` (see the module's doc: a
    lookup in flight is shared, a failure is remembered NEGATIVE_TTL s). Raises
    socket.gaierror (an OSError) as getaddrinfo does."""
    loop = asyncio.get_running_loop()
    state = _state(loop)
    key = (host, port)
    failed = state.failed.get(key)
    if failed is not None:
        at, exc = failed
        if time.monotonic() - at < NEGATIVE_TTL:
            raise type(exc)(*exc.args)
        del state.failed[key]
    fut = state.inflight.get(key)
    if fut is None:
        fut = loop.create_task(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                               name=f"getaddrinfo {host}")
        state.inflight[key] = fut
        fut.add_done_callback(lambda f: _settled(state, key, f))
    # Shielded: a connect that gives up (its timeout) leaves the lookup to the others.
    return await asyncio.shield(fut)


def _settled(state: _State, key: tuple[str, int], fut: asyncio.Future[list[AddrInfo]]) -> None:
    if state.inflight.get(key) is fut:
        del state.inflight[key]
    if fut.cancelled():
        return
    exc = fut.exception()  # (retrieved: no "exception was never retrieved" when all gave up)
    if isinstance(exc, OSError):
        state.failed[key] = (time.monotonic(), exc)
