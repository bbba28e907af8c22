"""Copies of a persisted fragment still held by the journal's members (their spools and
closed local fragments): where a cold read turns when every store's copy is rotten.

`stream_stored` proves a persisted fragment with fragment_store's verifying reader; when
the copy in every one of the journal's stores fails its proof, the reader tries the
`extra` sources it is given — these. Each asks one member, over the wire, for the
fragment's range `held_only` (serve only what you hold: spool or local fragments) with
`do_not_proxy`: a member that has it only in the store answers with the store's URL,
which is not a held copy, and is passed over (so two members never send each other
round in circles for a rotten object). Whatever comes back is proven by the fragment's
SHA-1 like any other copy before a byte of it is used; the reader then quarantines the
rotten objects and persists the good copy again under their keys (`verified.mend`).

Our own replica is not asked: a member serves offsets it holds itself from its spool
or local fragments before it ever looks in the store (`Replica.lookup`), so a cold read
happens only for ranges it does not hold.

The suppliers run on the verifying reader's thread (`asyncio.to_thread`): each network
step is handed to the coordinator's event loop (`run_coroutine_threadsafe`) and waited
for with a bounded timeout; chunks stream through, never the whole fragment in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from protocol import ReadContent, ReadRequest, ReadResponse, Status
from protocol.logs import get_logger

from .peer_connect import connect_member

log = get_logger(__name__)

STEP_TIMEOUT = 30.0
"""Seconds one step of a held-copy fetch (connect, a frame) may take."""

T = TypeVar("T")

Extra = tuple[str, Callable[[], Iterator[bytes]]]


class NotHeld(Exception):
    """The member does not hold the range (only the store does, or not at all)."""


def _on_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[T]],
             timeout: float = STEP_TIMEOUT) -> T:
    async def step() -> T:
        return await asyncio.wait_for(make(), timeout)
    return asyncio.run_coroutine_threadsafe(step(), loop).result(timeout + 5.0)


def held_copies(frag: Any, endpoints: Sequence[str],  # noqa: ANN401
                auth: dict | Callable[[], dict]) -> list[Extra]:
    """One lazy source per endpoint (in order) of `frag`'s raw content as a member holds
    it; `auth`: our peer credentials (Host.peer_auth's dict, or a function making it,
    called only when a source is used). Call from the event loop; the sources are
    iterated on another thread."""
    loop = asyncio.get_running_loop()
    return [(f"spool of {endpoint}", _supplier(loop, endpoint, auth, frag))
            for endpoint in dict.fromkeys(e for e in endpoints if e)]


def _supplier(loop: asyncio.AbstractEventLoop, endpoint: str, auth: dict | Callable[[], dict],
              frag: Any) -> Callable[[], Iterator[bytes]]:  # noqa: ANN401
    def supply() -> Iterator[bytes]:
        creds = auth() if callable(auth) else auth
        upstream = _on_loop(loop, lambda: connect_member([endpoint], creds))
        if upstream is None:
            raise NotHeld(f"{endpoint} is not reachable")
        try:
            _on_loop(loop, lambda: upstream.send(ReadRequest(
                journal=frag.journal, offset=frag.begin, end_offset=frag.end,
                do_not_proxy=True, held_only=True)))
            offset = frag.begin
            while offset < frag.end:
                frame = _on_loop(loop, upstream.read)
                msg = frame.message
                if isinstance(msg, ReadResponse):
                    if msg.status != Status.OK:
                        raise NotHeld(f"{endpoint} answered {msg.status.name} at {offset}")
                    if msg.fragment_url or (msg.fragment is not None and msg.fragment.backing_store):
                        raise NotHeld(f"{endpoint} has [{offset}, ...) only in the store")
                elif isinstance(msg, ReadContent):
                    if msg.offset != offset:
                        raise NotHeld(f"{endpoint} sent offset {msg.offset}, expected {offset}")
                    data = bytes(frame.payload[:frag.end - offset])
                    offset += len(data)
                    yield data
        finally:
            _on_loop(loop, upstream.close)
        log.info("persisted fragment read from a member's spool", journal=frag.journal,
                 begin=frag.begin, end=frag.end, member=endpoint)
    return supply
