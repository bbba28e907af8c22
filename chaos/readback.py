"""Reading everything back after a chaos run: through the coordinators, from each
replica on its own, and straight from the fragment store.

* `final_read`: the journal from offset 0 to its write head through `quire.client`
  (the coordinators route and proxy; persisted content may come from the store).
* `replica_read`: a raw Read RPC with do_not_proxy=True to one coordinator, so the
  bytes are that replica's own. Ranges it only has as persisted fragments (a
  ReadResponse with a fragment URL) are skipped: the store view covers them.
* `store_fragments`: every object under the journal's prefix, parsed by
  `fragment_store.keys.parse_key`, fetched and decoded with `fragment_store.codecs`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from fragment_store import codecs
from fragment_store.keys import parse_key
from fragment_store.stores import open_store
from quire.client import Client
from protocol import Hello, HelloAck, ReadContent, ReadRequest, ReadResponse, Status
from protocol.errors import ProtocolError
from protocol.stream import FrameStream

from .checker import JournalReadback, StoredFragment

__all__ = ["final_read", "replica_read", "store_fragments", "read_back"]

log = structlog.get_logger("chaos.readback")


async def final_read(client: Client, journal: str, *, timeout: float = 60.0) -> JournalReadback:
    out = JournalReadback(journal, b"")
    buf = bytearray()
    try:
        head = await asyncio.wait_for(client.write_head(journal), timeout)

        async def collect() -> None:
            expected = 0
            async for offset, data in client.read(journal, 0, end_offset=head):
                if offset != expected:
                    if not buf:
                        out.final_begin = offset  # content below was removed
                    elif offset > expected:
                        # A hole: offsets no member and no fragment holds (a pipeline
                        # sync rolled forward past an indefinite append's bytes). Filled
                        # with newlines so records stay aligned; the checker counts it
                        # and any acked append inside it is lost.
                        out.holes.append((expected, offset))
                        buf.extend(b"\n" * (offset - expected))
                    else:
                        raise RuntimeError(f"offset jump {expected} -> {offset}")
                buf.extend(data)
                expected = offset + len(data)
                if expected >= head:
                    return

        if head:
            await asyncio.wait_for(collect(), timeout)
    except Exception as exc:  # noqa: BLE001 - reported, counted by the checker
        out.read_error = f"{type(exc).__name__}: {exc}"
        log.warning("readback.final_failed", journal=journal, error=out.read_error)
    out.final = bytes(buf)
    return out


async def _replica_rpc(endpoint: str, journal: str, offset: int,
                       spans: list[tuple[int, bytes]]) -> int | None:
    """One non-blocking Read RPC from `offset`; returns where to continue, or None
    when the replica has nothing more (its head, an error status, no progress)."""
    stream = await FrameStream.connect(endpoint, timeout=5.0)
    nxt = offset
    try:
        await stream.send(Hello())
        await stream.read_message(HelloAck)
        await stream.send(ReadRequest(journal=journal, offset=offset, do_not_proxy=True))
        while True:
            try:
                frame = await stream.read()
            except ProtocolError:
                return nxt if nxt > offset else None  # closed: continue where it stopped
            msg = frame.message
            if isinstance(msg, ReadResponse):
                if msg.status != Status.OK:
                    return None
                if msg.fragment_url and msg.fragment is not None:
                    # Persisted-only content: the store view covers it.
                    return msg.fragment.end if msg.fragment.end > nxt else None
            elif isinstance(msg, ReadContent):
                data = bytes(frame.payload)
                if data:
                    if spans and spans[-1][0] + len(spans[-1][1]) == msg.offset:
                        spans[-1] = (spans[-1][0], spans[-1][1] + data)
                    else:
                        spans.append((msg.offset, data))
                    nxt = msg.offset + len(data)
            else:
                return None
    finally:
        await stream.close()


async def replica_read(endpoint: str, journal: str, *, timeout: float = 30.0
                       ) -> list[tuple[int, bytes]]:
    """The spans one coordinator serves from its own replica (do_not_proxy)."""
    spans: list[tuple[int, bytes]] = []

    async def run() -> None:
        offset: int | None = 0
        for _ in range(10_000):  # bounded: each round makes progress or stops
            assert offset is not None
            offset = await _replica_rpc(endpoint, journal, offset, spans)
            if offset is None:
                return

    try:
        await asyncio.wait_for(run(), timeout)
    except Exception as exc:  # noqa: BLE001 - a replica view is best effort
        log.warning("readback.replica_failed", endpoint=endpoint, journal=journal, error=str(exc))
    return spans


def store_fragments(store_url: str, journal: str, **store_options: Any) -> list[StoredFragment]:
    """Every persisted fragment of `journal`, decoded (blocking; run in a thread)."""
    store = open_store(store_url, **store_options)
    out: list[StoredFragment] = []
    for info in store.list(journal + "/"):
        try:
            frag = parse_key(journal, info.key)
        except Exception:  # noqa: BLE001 - foreign objects are skipped, as listings do
            continue
        try:
            raw = store.read_all(info.key)
            data: bytes | None = codecs.decompress(frag.codec, raw)
            error = ""
        except Exception as exc:  # noqa: BLE001 - counted as a bad fragment
            data, error = None, f"{type(exc).__name__}: {exc}"
        out.append(StoredFragment(info.key, journal, frag.begin, frag.end, frag.sum, data, error))
    return out


async def read_back(client: Client, journals: list[str], members: dict[str, list[str]],
                    store_url: str | None, store_options: dict[str, Any]) -> list[JournalReadback]:
    """Final read + replica views + store fragments of every journal (concurrently)."""

    async def one(journal: str) -> JournalReadback:
        rb = await final_read(client, journal)
        views = await asyncio.gather(*(replica_read(e, journal) for e in members.get(journal, [])))
        for endpoint, spans in zip(members.get(journal, []), views):
            rb.views[f"replica:{endpoint}"] = spans
        if store_url:
            try:
                rb.fragments = await asyncio.to_thread(store_fragments, store_url, journal,
                                                       **store_options)
            except Exception as exc:  # noqa: BLE001
                log.warning("readback.store_failed", journal=journal, error=str(exc))
                rb.read_error = (rb.read_error + "; " if rb.read_error else "") + f"store: {exc}"
        return rb

    return list(await asyncio.gather(*(one(j) for j in journals)))
