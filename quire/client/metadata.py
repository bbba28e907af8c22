"""The metadata RPCs of the client: one request, one response, retried while the
answer is a routing status or an endpoint is unreachable (List, Apply, ListFragments,
ListBrokers). `Client` inherits them; they need only its routes, pool and timeouts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TypeVar

from protocol import (
    ApplyChange,
    ApplyRequest,
    ApplyResponse,
    BrokerInfo,
    FragmentInfo,
    Header,
    JournalSpec,
    LabelSelector,
    LabelSet,
    ListBrokersRequest,
    ListBrokersResponse,
    ListEntry,
    ListFragmentsRequest,
    ListFragmentsResponse,
    ListRequest,
    ListResponse,
    Message,
    Status,
    parse_selector,
    validate_journal_name,
)
from protocol.apply_chunks import MAX_TXN_BYTES, MAX_TXN_OPS, ApplyResult
from protocol.errors import ProtocolError, Unavailable, for_status

from .chunked import Progress, apply_chunked, edits_of, fits_one
from .connection import ConnectionPool
from .retry import ROUTING_STATUSES, backoff, reason, strip_status
from .routes import RouteCache

R = TypeVar("R", bound=Message)

LIST_PAGE = 1000
"""Journals per List page (a coordinator also stops a page short of 512 KiB)."""


class MetadataCalls:
    routes: RouteCache
    pool: ConnectionPool
    rpc_timeout: float
    retry_timeout: float
    applied_revision: int

    async def unary(self, request: Message, expect: type[R], *, journal: str = "",
                    endpoint: str | None = None, idempotent: bool = True) -> R:
        """One request, one response, with retries; a non-OK status raises."""
        deadline = time.monotonic() + self.retry_timeout
        attempt = 0
        while True:
            target = endpoint or (self.routes.for_read(journal) if journal else self.routes.seed())
            sent = False
            try:
                async with self.pool.lease(target) as conn:
                    sent = True
                    await conn.send(request)
                    frame = await conn.read(self.rpc_timeout)
                if not isinstance(frame.message, expect):
                    raise ProtocolError(f"{target} answered {type(request).__name__} with "
                                        f"{type(frame.message).__name__}")
                response = frame.message
                status = getattr(response, "status", Status.OK)
                if status == Status.OK:
                    if journal:
                        self.routes.update(journal, getattr(response, "header", None))
                    return response
                if status not in ROUTING_STATUSES or time.monotonic() >= deadline:
                    raise for_status(status)(strip_status(status, getattr(response, "message", "")),
                                             journal=journal, detail=response)
                if journal:
                    self.routes.invalidate(journal)
            except Unavailable as exc:
                self.routes.mark_down(target)
                if (sent and not idempotent) or time.monotonic() >= deadline:
                    raise Unavailable(reason(exc), journal=journal) from exc
            await asyncio.sleep(min(backoff(attempt), max(0.0, deadline - time.monotonic())))
            attempt += 1

    async def list_journals(self, selector: LabelSelector | str = "") -> list[ListEntry]:
        if isinstance(selector, str):
            selector = parse_selector(selector)
        entries: list[ListEntry] = []
        token = ""
        while True:  # a page at a time: one response holds at most ~1,800 entries
            response = await self.unary(ListRequest(selector=selector, page_limit=LIST_PAGE,
                                                    page_token=token), ListResponse)
            entries.extend(response.journals)
            # Each listed route primes the route cache (as Gazette's ListAllJournals):
            # appends over thousands of journals then go to their primaries, not each
            # first one to a seed that proxies it.
            etcd = response.header.etcd if response.header is not None else None
            for entry in response.journals:
                if etcd is not None and entry.route.primary_endpoint:
                    self.routes.update(entry.spec.name, Header(route=entry.route, etcd=etcd))
            # (A coordinator without paging ignores page_limit and answers every entry.)
            if not response.next_page_token or not response.journals:
                break
            token = response.next_page_token
        return sorted(entries, key=lambda e: e.spec.name)

    async def get_journal(self, name: str) -> ListEntry:
        """The entry of one journal; JournalNotFound if there is none."""
        validate_journal_name(name, "journal")
        for entry in await self.list_journals(LabelSelector(include=LabelSet.of(name=name))):
            if entry.spec.name == name:
                return entry
        raise for_status(Status.JOURNAL_NOT_FOUND)("no such journal", journal=name)

    async def apply(self, changes: Iterable[ApplyChange | JournalSpec], *,
                    max_txn_size: int = MAX_TXN_OPS, max_txn_bytes: int = MAX_TXN_BYTES) -> int:
        """Apply upserts and deletes; returns the etcd revision of the (last) write.

        A bare JournalSpec is an upsert without a revision check (-1). Changes that fit
        one etcd transaction (at most `max_txn_size` of them, within `max_txn_bytes`)
        are one ApplyRequest, all or none. More are applied as `apply_chunked` does:
        each transaction atomic and guarded by the revisions read, unchanged specs
        skipped, and ApplyIncomplete naming what was and was not applied on a failure
        part-way."""
        items: list[ApplyChange] = []
        for change in changes:
            if isinstance(change, JournalSpec):
                change.validate()
                change = ApplyChange(upsert=change, expect_mod_revision=-1)
            elif change.upsert is not None:
                change.upsert.validate()
            items.append(change)
        if not fits_one(edits_of(items), max_txn_size, max_txn_bytes):
            result = await self.apply_chunked(items, max_txn_size=max_txn_size,
                                              max_txn_bytes=max_txn_bytes)
            return result.revision
        response = await self.unary(ApplyRequest(changes=tuple(items)), ApplyResponse,
                                    idempotent=False)
        self.applied_revision = max(self.applied_revision, response.revision)
        return response.revision

    async def apply_chunked(self, changes: Iterable[ApplyChange | JournalSpec], *,
                            max_txn_size: int = MAX_TXN_OPS, max_txn_bytes: int = MAX_TXN_BYTES,
                            progress: Progress | None = None) -> ApplyResult:
        """Apply any number of changes in transactions that fit etcd's limits
        (quire/client/chunked.py, docs/operations.md): reads the current specs, skips
        those already equal (`unchanged`), pins the others to the revisions read, and
        sends chunks of at most `max_txn_size` changes. Re-applying the same changes
        after an ApplyIncomplete finishes the work."""
        items = [ApplyChange(upsert=c, expect_mod_revision=-1) if isinstance(c, JournalSpec) else c
                 for c in changes]
        return await apply_chunked(self, items, max_txn_size=max_txn_size,
                                   max_txn_bytes=max_txn_bytes, progress=progress)

    async def delete(self, name: str, *, expect_mod_revision: int | None = None) -> int:
        """Delete a journal spec; JournalNotFound if it does not exist."""
        if expect_mod_revision is None:
            expect_mod_revision = (await self.get_journal(name)).mod_revision
        return await self.apply([ApplyChange(delete=name, expect_mod_revision=expect_mod_revision)])

    async def list_fragments(self, journal: str, *, begin_mod_time: int = 0,
                             end_mod_time: int = 0, signature_ttl: float = 60.0) -> list[FragmentInfo]:
        validate_journal_name(journal, "journal")
        out: list[FragmentInfo] = []
        token = 0
        while True:
            response = await self.unary(
                ListFragmentsRequest(journal=journal, begin_mod_time=begin_mod_time,
                                     end_mod_time=end_mod_time, next_page_token=token,
                                     signature_ttl=signature_ttl),
                ListFragmentsResponse, journal=journal)
            out.extend(response.fragments)
            # The token is the next fragment's begin; a token that does not move would
            # loop forever on a confused broker.
            if not response.next_page_token or response.next_page_token <= token:
                return out
            token = response.next_page_token

    async def list_brokers(self) -> list[BrokerInfo]:
        response = await self.unary(ListBrokersRequest(), ListBrokersResponse)
        return sorted(response.brokers, key=lambda b: (b.id.zone, b.id.suffix))
