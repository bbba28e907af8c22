"""Reading a journal: a stream of (offset, bytes) that survives route changes.

One Read RPC streams fragment metadata (ReadResponse) followed by content (ReadContent).
The Reader re-issues the RPC from where it stopped when a connection or route breaks
(Gazette's RetryReader), so a caller sees every committed byte once, in order.

Offset jumps: when the broker answers with an offset greater than the one asked for
(content below it was removed from every store), the next yielded offset is larger than
the previous end. The caller sees it by comparing offsets; `offset_jumps` counts them.

Direct store reads: with `from_store=True` the request sets do_not_proxy, and for a
fragment only the store holds the broker answers with its `fragment_url` and ends the
RPC instead of streaming it; the client then reads the fragment from the store itself
(fragment_store for file:// and s3://, HTTP GET for presigned URLs) and continues with a
new Read at the fragment's end. The client proves each fragment by its SHA-1 before
yielding a byte of it (store_reader); a copy that fails is read through the broker
instead (which tries the journal's other stores, quarantines and mends), or, where no
good copy exists, the read fails with FRAGMENT_CORRUPT. Without it, the broker streams persisted content
through itself (the URL in its metadata is informational and ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Protocol

from protocol import Fragment, ReadContent, ReadRequest, ReadResponse, Status
from protocol.errors import ProtocolError, StatusError, Unavailable, for_status

from . import store_reader
from .connection import ConnectionPool
from .retry import ROUTING_STATUSES, reason, strip_status
from .routes import RouteCache


class ReadSession(Protocol):
    """What a Reader needs of its client (client.Client is one)."""

    routes: RouteCache
    pool: ConnectionPool
    retry_timeout: float

Item = tuple[int, bytes]


class _Reissue(Exception):
    """The current RPC is done with (after a direct store read); start another."""


class Reader:
    def __init__(self, client: ReadSession, journal: str, offset: int = 0, *, block: bool = False,
                 follow: bool = False, end_offset: int = 0, from_store: bool = False,
                 metadata_only: bool = False, unverified_reads_risk_corruption: bool = False) -> None:
        if offset < -1:
            raise ValueError(f"offset must be >= -1, got {offset}")
        if end_offset and offset >= 0 and end_offset < offset:
            raise ValueError(f"end_offset {end_offset} is before offset {offset}")
        self.client = client
        self.journal = journal
        self.offset = offset
        """The next offset to read (-1 until the broker resolved the write head)."""
        self.block = block or follow
        self.follow = follow
        self.end_offset = end_offset
        self.from_store = from_store
        self.metadata_only = metadata_only
        self.unverified_reads_risk_corruption = unverified_reads_risk_corruption
        self._via_broker_until = 0
        """A fragment whose stored copy failed its proof is read through the broker."""
        self.write_head = 0
        self.fragment: Fragment | None = None
        self.fragment_url = ""
        self.offset_jumps = 0
        self._gen: AsyncIterator[Item] | None = None

    # -- async iterator -------------------------------------------------------------

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Item:
        if self._gen is None:
            self._gen = self._iterate()
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        if self._gen is not None:
            await self._gen.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- metadata -------------------------------------------------------------------

    async def probe(self) -> int:
        """One non-blocking metadata read; returns the write head."""
        self.metadata_only, self.block = True, False
        async for _ in self._with_retries():
            pass
        return self.write_head

    # -- internals ------------------------------------------------------------------

    async def _iterate(self) -> AsyncIterator[Item]:
        async with contextlib.aclosing(self._with_retries()) as items:
            async for item in items:
                yield item

    async def _with_retries(self) -> AsyncIterator[Item]:
        routes = self.client.routes
        attempt = 0
        deadline = time.monotonic() + self.client.retry_timeout
        while True:
            if self.end_offset and self.offset >= self.end_offset:
                return
            endpoint = routes.for_read(self.journal)
            try:
                async with contextlib.aclosing(self._one_rpc(endpoint)) as items:
                    async for item in items:
                        attempt, deadline = 0, time.monotonic() + self.client.retry_timeout
                        yield item
                return
            except _Reissue:
                attempt = 0
                continue
            except Unavailable as exc:
                routes.mark_down(endpoint)
                if not self.follow and time.monotonic() >= deadline:
                    raise Unavailable(reason(exc), journal=self.journal) from exc
            except StatusError as exc:
                if exc.status not in ROUTING_STATUSES:
                    raise
                if not self.follow and time.monotonic() >= deadline:
                    raise
            delay = 0.05 * 2 ** min(attempt, 7)
            await asyncio.sleep(min(delay, 5.0))
            attempt += 1

    async def _one_rpc(self, endpoint: str) -> AsyncIterator[Item]:
        pool = self.client.pool
        conn = await pool.acquire(endpoint)
        clean = False
        try:
            await conn.send(ReadRequest(
                journal=self.journal, offset=self.offset, block=self.block,
                do_not_proxy=self.from_store and self.offset >= self._via_broker_until,
                metadata_only=self.metadata_only,
                end_offset=self.end_offset,
                min_etcd_revision=getattr(self.client, "applied_revision", 0)))
            while True:
                frame = await conn.read()
                message = frame.message
                if isinstance(message, ReadResponse):
                    if await self._on_metadata(message):
                        clean = True
                        return
                    if self.from_store and message.fragment_url and message.fragment is not None \
                            and message.fragment.end > self._via_broker_until:
                        conn.abort()
                        async for item in self._from_url(message):
                            yield item
                        raise _Reissue()
                elif isinstance(message, ReadContent):
                    for item in self._on_content(message.offset, frame.payload):
                        yield item
                    if self.end_offset and self.offset >= self.end_offset:
                        # The broker stops here too, but might still send a trailing
                        # frame; a fresh connection next time is cheaper than a doubt.
                        return
                else:
                    raise ProtocolError(f"{endpoint} sent {type(message).__name__} in a read")
        finally:
            if clean:
                pool.release(conn)
            else:
                conn.abort()

    async def _on_metadata(self, message: ReadResponse) -> bool:
        """Absorb a ReadResponse; True when it ends the RPC cleanly."""
        routes = self.client.routes
        if message.status != Status.OK and message.status != Status.OFFSET_NOT_YET_AVAILABLE:
            # A refusal may name the right members (NOT_JOURNAL_BROKER carries the
            # route): forget the old route, keep the one the broker just told us.
            routes.invalidate(self.journal)
        routes.update(self.journal, message.header)
        self.write_head = max(self.write_head, message.write_head)
        if message.status == Status.OFFSET_NOT_YET_AVAILABLE and not self.block:
            if self.offset < 0:
                self.offset = message.write_head
            return True
        if message.status != Status.OK:
            raise for_status(message.status)(strip_status(message.status, message.message),
                                             journal=self.journal, detail=message)
        if self.offset < 0:
            self.offset = message.offset
        elif message.offset > self.offset:
            self.offset_jumps += 1
            self.offset = message.offset
        self.fragment = message.fragment
        self.fragment_url = message.fragment_url
        return self.metadata_only

    def _on_content(self, offset: int, payload: bytes | memoryview) -> list[Item]:
        data = bytes(payload)
        if not data:
            return []
        if self.offset >= 0 and offset < self.offset:
            # Overlap with what we already yielded (a replayed chunk): skip it.
            data = data[self.offset - offset:]
            offset = self.offset
            if not data:
                return []
        elif self.offset >= 0 and offset > self.offset:
            self.offset_jumps += 1
        if self.end_offset and offset + len(data) > self.end_offset:
            data = data[:max(0, self.end_offset - offset)]
        self.offset = offset + len(data)
        self.write_head = max(self.write_head, self.offset)
        return [(offset, data)] if data else []

    async def _from_url(self, message: ReadResponse) -> AsyncIterator[Item]:
        fragment = message.fragment
        assert fragment is not None
        start = max(self.offset, fragment.begin)
        stop = fragment.end if not self.end_offset else min(fragment.end, self.end_offset)
        from fragment_store.verified import FragmentCorrupt

        try:
            async for chunk in store_reader.read_fragment_url(
                    message.fragment_url, fragment, start,
                    unverified_reads_risk_corruption=self.unverified_reads_risk_corruption):
                for item in self._on_content(start, chunk):
                    yield item
                start += len(chunk)
                if start >= stop:
                    break
        except FragmentCorrupt:
            # Nothing of it was yielded (proof comes first): the broker reads it for us
            # from a good copy, or answers FRAGMENT_CORRUPT.
            self._via_broker_until = fragment.end
            raise _Reissue() from None
        if self.offset < stop:
            raise ProtocolError(f"fragment {fragment.begin}-{fragment.end} of {self.journal} "
                                f"ended at {self.offset} when read from {message.fragment_url}")


__all__ = ["Reader"]
