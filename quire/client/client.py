"""The asyncio client: appends, reads, and (inherited from metadata.py) the metadata RPCs.

    client = Client(["127.0.0.1:8080"])
    result = await client.append("topic/part-000", b"hello\\n")
    async for offset, data in client.read("topic/part-000", offset=0):
        ...
    await client.close()

Retries: only what is safe. Metadata reads (List, ListFragments, ListBrokers) and reads
retry on unreachable endpoints and routing statuses until `retry_timeout`. An append is
retried when the cluster certainly did not commit it — the failure came before its
commit was sent, or the broker answered with a routing status (UNAVAILABLE included:
brokers answer it only before the commit reached any replica) — and its body can be
sent again. After the commit was sent the outcome is unknown: the connection was lost,
the answer timed out, or the broker answered COMMIT_UNKNOWN (its replication broke
after it forwarded the commit). Such an append is never re-sent with offset 0; it
raises `CommitUnknown` (an indefinite failure: the record may or may not be in the
journal, at most once). With an explicit `offset` it is retried at that offset, which
cannot land twice; if the retry then fails for any reason (WRONG_APPEND_OFFSET: the
head moved, by the first attempt or by another writer) it raises CommitUnknown too.
Every other non-OK status becomes the StatusError subclass of that status.

Exactly-once (`txn=TxnId(...)`, producer.py, docs/exactly-once.md): an identified
append is re-sent after every indefinite failure (COMMIT_UNKNOWN, a lost answer, a
timeout, a lost connection) until an authoritative answer or `retry_timeout`: the
primary answers a transaction that already committed with its original commit and
never writes it twice. Only when the deadline passes does it raise CommitUnknown.

An attempt its primary leaves unanswered (a silent socket: the primary's host cut off)
is abandoned once another coordinator names a new primary for the journal, long before
`rpc_timeout` (reroute.py): an outcome unknown like any other, re-sent at once where the
journal went when it may be.
"""

from __future__ import annotations

import asyncio
import time
from ssl import SSLContext
from collections.abc import Callable, Iterable
from typing import Any

from protocol import (AppendChunk, AppendCommit, AppendRequest, AppendResponse, LabelSelector,
                      LabelSet, Status, parse_selector, validate_journal_name)
from protocol.credentials import TokenFile, TokenSource
from protocol.discovery import effective_env
from protocol.errors import CommitUnknown, ProtocolError, Unavailable, caused, for_status
from protocol.stream import ConnectionClosed
from protocol.wire import MAX_CHUNK, FrameTemplate, encode_frame

from .body import AppendData, Body
from .producer import TxnId
from .connection import Connection, ConnectionPool
from .metadata import MetadataCalls
from .reader import Reader
from .reroute import REROUTE_GRACE, Rerouter, probe_primary
from .results import AppendResult
from .retry import ROUTING_STATUSES, Rerouted, backoff, reason, strip_status
from .routes import RouteCache

_CHUNK = FrameTemplate(AppendChunk())
_COMMIT = encode_frame(AppendCommit())
"""An AppendCommit frame is always the same bytes."""
_COMMIT_BYTES = b"".join(_COMMIT)
_FOREVER = float("inf")
_WHOLE = Body(b"")
"""Stands for the Body of a whole append (its bytes are re-sent as they are)."""
JOURNAL_CACHE_MAX = 16_384
"""Journals whose validated name and encoded plain request are kept (each cache emptied
when full): over more, round-robin appends validate and encode each append anew (~0.7
KiB an entry of both: ~11 MiB full; bench.scale over 10,000 journals, docs/benchmarks.md)."""


class _Ambiguous(Exception):
    """The append's commit was sent but no answer came: it may or may not have landed."""

    def __init__(self, cause: Unavailable) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _commit_unknown(journal: str, offset: int, why: str, then: str = "",
                    detail: object = None, txn: TxnId | None = None) -> CommitUnknown:
    text = f"outcome unknown: {why}" + (f"; {then}" if then else "")
    text += "; the append may or may not have been committed"
    if txn is not None:
        text += f"; re-sent as txn {txn.txn} of history {txn.history} until the retry timeout"
    else:
        text += "; it was not re-sent" if not offset else f"; re-sent only at offset {offset}"
    return CommitUnknown(text, journal=journal, detail=detail)


class Client(MetadataCalls):
    def __init__(self, endpoints: Iterable[str] | str | None = None, *, connect_timeout: float = 5.0,
                 rpc_timeout: float = 60.0, retry_timeout: float = 30.0,
                 max_idle: int = 64, token: TokenSource | None = None,
                 ssl: SSLContext | None = None) -> None:
        """`endpoints`: coordinators to start from; default $QUIRE_BROKER, else the local
        cluster `quire up` runs (protocol/discovery.py), else 127.0.0.1:8080.
        `token`: the capability token every connection presents, or a callable giving
        the current one (protocol.auth.TokenFile); default $QUIRE_TOKEN, else a TokenFile
        of $QUIRE_TOKEN_FILE (docs/security.md). `ssl`: a client context for coordinators that
        serve TLS (protocol.tls.client_context; default from $QUIRE_TLS_CA, if set). Each
        default also comes from a running local cluster when the variable is unset."""
        env = effective_env()
        if endpoints is None:
            endpoints = env.get("QUIRE_BROKER") or "127.0.0.1:8080"
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if token is None:
            token = env.get("QUIRE_TOKEN", "")
            if not token and env.get("QUIRE_TOKEN_FILE"):
                token = TokenFile(env["QUIRE_TOKEN_FILE"])
        if ssl is None and env.get("QUIRE_TLS_CA"):
            from protocol.tls import client_context

            ssl = client_context(env["QUIRE_TLS_CA"], env.get("QUIRE_TLS_CERT"),
                                 env.get("QUIRE_TLS_KEY"))
        self.routes = RouteCache(list(endpoints))
        self.applied_revision = 0
        """The etcd revision of this client's last Apply: appends and reads carry it as
        `min_etcd_revision`, so a coordinator that has not yet seen a spec we just
        applied waits for it (boundedly) instead of answering JOURNAL_NOT_FOUND."""
        self.pool = ConnectionPool(connect_timeout=connect_timeout, max_idle=max_idle,
                                   token=token, ssl=ssl)
        # (a function of the client: a caller may replace its route cache)
        self.pool.rerouter = Rerouter(
            lambda journal, avoid: probe_primary(self.routes, self.pool, journal, avoid))
        self.rpc_timeout = rpc_timeout
        self.retry_timeout = retry_timeout
        self._valid_names: set[str] = set()
        """Journal names already validated (appends skip the check; bounded)."""
        self.on_attempt: Callable[[str, AppendResponse | BaseException], None] | None = None
        """Called with (endpoint, its answer or its failure) after every attempt of an
        append (the client retries inside `append`): `quire chaos` traces a duplicate
        to the answer that made it retry."""
        self._plain_requests: dict[str, list[Any]] = {}
        """Per journal, [the AppendRequest of a plain append, its encoded frame, the size
        of the last whole append, that frame + the header of a chunk of that size]."""

    @property
    def endpoints(self) -> list[str]:
        return list(self.routes.seeds)

    async def close(self) -> None:
        await self.pool.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- append ---------------------------------------------------------------------

    async def append(self, journal: str, data: AppendData, *, offset: int = 0,
                     check_registers: LabelSelector | str | None = None,
                     union_registers: LabelSet | None = None,
                     subtract_registers: LabelSet | None = None,
                     suspend: str = "resume", retry_timeout: float | None = None,
                     txn: TxnId | None = None, roll_below: int = 0) -> AppendResult:
        """Append `data` as one transaction; all of it commits, or none of it.

        `roll_below`: the primary first closes its open fragment if that holds content
        below this offset (AppendRequest.roll_below; the jobs scheduler's roll).

        `txn`: an exactly-once identifier (producer.py): the append is re-sent until an
        authoritative answer, and lands at most once (a re-send that finds it committed
        returns the original commit)."""
        if journal not in self._valid_names:
            validate_journal_name(journal, "journal")
            if len(self._valid_names) >= JOURNAL_CACHE_MAX:
                self._valid_names.clear()
            self._valid_names.add(journal)
        if check_registers is not None and isinstance(check_registers, str):
            check_registers = parse_selector(check_registers)
        plain = (not offset and check_registers is None and union_registers is None
                 and subtract_registers is None and suspend == "resume" and txn is None
                 and not roll_below)
        # One clock reading and one route lookup for the first attempt (the deadline,
        # the endpoint, the primary it expects, the revision it names, the watchdog).
        now = time.monotonic()
        endpoint, primary, known = self.routes.append_target(journal, now)
        cached = self._plain_requests.get(journal) if plain else None
        if cached is not None and cached[0].min_etcd_revision == self.applied_revision \
                and cached[0].route_revision == known:
            request, encoded = cached[0], cached[1]  # encoded once per journal
        else:
            cached = None
            request, encoded = AppendRequest(journal=journal, offset=offset, check_registers=check_registers,
                                    union_registers=union_registers,
                                    subtract_registers=subtract_registers, suspend=suspend,
                                    min_etcd_revision=self.applied_revision, route_revision=known,
                                    roll_below=roll_below,
                                    **(txn.fields() if txn is not None else {})), None  # type: ignore[arg-type]
            if plain:
                if len(self._plain_requests) >= JOURNAL_CACHE_MAX:
                    self._plain_requests.clear()
                encoded = encode_frame(request)
                cached = [request, encoded, 0, b""]
                self._plain_requests[journal] = cached
        # Safe to re-send after an unknown outcome: an explicit offset cannot land
        # twice, nor can an identified transaction (the primary deduplicates it).
        resendable = offset != 0 or txn is not None
        # Bytes of at most one chunk (the common case) go whole, in one send; anything
        # else is streamed from a Body.
        whole = data if isinstance(data, bytes) and 0 < len(data) <= MAX_CHUNK else None
        size = len(whole) if whole is not None else 0
        body = Body(data) if whole is None else _WHOLE
        frames = None
        if whole is not None and cached is not None:
            # A plain append's frames: [request + the chunk's header, data, commit], the
            # first kept per journal for the last size appended (appends of one size
            # are the common case: one frame encoded per journal, not per append).
            if cached[2] != size:
                cached[2], cached[3] = size, b"".join(encoded + _CHUNK.encode(whole)[:1])
            frames = [cached[3], whole, _COMMIT_BYTES]
        deadline = now + (self.retry_timeout if retry_timeout is None else retry_timeout)
        attempt = 0
        # Why an earlier attempt's outcome is unknown (its commit was sent). Once set, no
        # later failure may be reported as definite: that attempt may have landed.
        unknown = ""
        # A stalled attempt is abandoned once its journal moved (reroute.py): at once
        # for an identified append, after REROUTE_GRACE for one that cannot be re-sent
        # as freely.
        grace = 0.0 if txn is not None else REROUTE_GRACE
        while True:
            # The primary this attempt expects to answer ("": a proxy's choice).
            expect = endpoint if primary == endpoint else ""
            rerouted = False
            try:
                if whole is not None:
                    response = await self._append_whole(endpoint, encoded or encode_frame(request),
                                                        whole, journal, expect, grace, now, frames)
                else:
                    response = await self._append_once(endpoint, request, body, encoded,
                                                       journal=journal, expect=expect, grace=grace)
            except _Ambiguous as exc:
                if self.on_attempt is not None:
                    self.on_attempt(endpoint, exc.cause)
                # Rerouted: the endpoint did not fail us, the journal left it (the route
                # cache already has where it went): no mark-down, no back-off.
                rerouted = isinstance(exc.cause, Rerouted)
                if not rerouted:
                    self.routes.mark_down(endpoint)
                unknown = unknown or f"the commit was sent, then {reason(exc.cause)}"
                # Re-sending at the same explicit offset cannot land twice.
                if not resendable or not body.rewind() or time.monotonic() >= deadline:
                    raise caused(_commit_unknown(journal, offset, unknown, txn=txn), exc.cause)
            except Unavailable as failed:
                if self.on_attempt is not None:
                    self.on_attempt(endpoint, failed)
                rerouted = isinstance(failed, Rerouted)
                if not rerouted:
                    self.routes.mark_down(endpoint)
                if not body.rewind() or time.monotonic() >= deadline:
                    if unknown:
                        raise caused(_commit_unknown(journal, offset, unknown,
                                                     f"a retry failed: {reason(failed)}", txn=txn),
                                     failed)
                    raise caused(Unavailable(reason(failed), journal=journal), failed)
            except BaseException as other:
                if self.on_attempt is not None:
                    self.on_attempt(endpoint, other)
                raise
            else:
                if self.on_attempt is not None:
                    self.on_attempt(endpoint, response)
                status = response.status
                if status == Status.OK:
                    if response.header is not None:  # (None: our route is current)
                        self.routes.update(journal, response.header)
                    commit = response.commit
                    return AppendResult(journal=journal, begin=commit.begin if commit else 0,
                                        end=commit.end if commit else 0, commit=commit,
                                        registers=response.registers)
                message = strip_status(status, response.message)
                if status == Status.COMMIT_UNKNOWN:
                    # The broker sent our commit to replicas and then failed: like a lost
                    # answer, retried only at an explicit offset.
                    self.routes.invalidate(journal)
                    unknown = unknown or message
                    if not resendable or not body.rewind() or time.monotonic() >= deadline:
                        raise _commit_unknown(journal, offset, unknown, detail=response, txn=txn)
                elif status not in ROUTING_STATUSES or not body.rewind() \
                        or time.monotonic() >= deadline:
                    self.routes.invalidate(journal)
                    if unknown and (txn is None or status in ROUTING_STATUSES):
                        # E.g. WRONG_APPEND_OFFSET: the head moved — maybe by our own
                        # earlier attempt, maybe by another writer.
                        raise _commit_unknown(journal, offset, unknown, f"a retry at offset {offset} "
                                              f"answered {status.name}: {message}", detail=response)
                    raise for_status(status)(message, journal=journal, detail=response)
                else:
                    self.routes.invalidate(journal)
                    self.routes.update(journal, response.header)
            if not rerouted:
                await asyncio.sleep(min(backoff(attempt), max(0.0, deadline - time.monotonic())))
                attempt += 1
            endpoint, primary = self.routes.for_append(journal), self.routes.primary(journal)
            now = 0.0  # the next attempt reads the clock itself

    async def _append_once(self, endpoint: str, request: AppendRequest, body: Body,
                           encoded: list[bytes | memoryview] | None = None, *, journal: str = "",
                           expect: str = "", grace: float = 0.0) -> AppendResponse:
        """`encoded`: the request's frame, if already made. `journal`, `expect`,
        `grace`: for the rerouter (ConnectionPool.watch)."""
        whole = body.whole()
        if whole is not None:
            return await self._append_whole(endpoint, encoded or encode_frame(request), whole,
                                            journal, expect, grace)
        conn = await self.pool.acquire(endpoint)
        # The rerouter may close a stalled stream whose journal moved (its own read
        # timeout below still bounds the answer).
        self.pool.watch(conn, self.rpc_timeout or float("inf"), journal, expect, grace)
        # The broker may answer before the commit (e.g. JOURNAL_NOT_FOUND) and stop
        # reading our chunks; listening while sending keeps a big append from blocking
        # on a full socket buffer that will never drain.
        answer = asyncio.ensure_future(conn.read(self.rpc_timeout))
        committed = False
        try:
            conn.write(request)
            async for chunk in body.chunks():
                conn.write(AppendChunk(), chunk)
                if await self._drain_or_answer(conn, answer):
                    break
            else:
                conn.write(AppendCommit())
                committed = True
                await self._drain_or_answer(conn, answer)
            try:
                frame = await answer
            except Unavailable as exc:
                if committed:
                    raise caused(_Ambiguous(exc), exc)
                raise
            if not isinstance(frame.message, AppendResponse):
                raise ProtocolError(f"{endpoint} answered an append with {type(frame.message).__name__}")
            if not committed:
                conn.broken = True  # answered early: the rest of our stream is unread
            return frame.message
        except BaseException:
            if not answer.done():
                answer.cancel()
            # Closing mid-stream rolls back an uncommitted append on the broker.
            conn.abort()
            raise
        finally:
            self.pool.unwatch(conn)
            self.pool.release(conn)

    async def _append_whole(self, endpoint: str, request: list[bytes | memoryview],
                            data: bytes | memoryview, journal: str = "", expect: str = "",
                            grace: float = 0.0, now: float = 0.0,
                            frames: list[bytes | memoryview] | None = None) -> AppendResponse:
        """An append whose content is at most one chunk of bytes: request, chunk and
        commit leave in one send, and the answer is read inline — no task, no drain, no
        timer (the pool's watchdog bounds the wait by rpc_timeout). Nothing here waits
        on the socket's send buffer (the transport holds at most this one chunk), so a
        broker that answers early, before reading our stream, cannot block us: its
        answer is read as any other. The commit is queued with the rest, so a failure
        after that is ambiguous (as after a commit in `_append_once`).

        `frames`: request, chunk and commit already encoded, if the caller has them.
        `now`: the caller's monotonic clock reading, used as the send time if a pooled
        connection is at hand. The small-append path counts its Python-level calls
        (bench/calls.py), so it reads the answer from the stream itself (no
        coroutine level of the Connection's between) and lets the pool do send + watch
        and unwatch + release in one call each."""
        pool = self.pool
        if frames is None:
            frames = request + _CHUNK.encode(data) + _COMMIT if data else request + _COMMIT
        conn = pool.take(endpoint)
        if conn is None:
            conn = await pool.acquire(endpoint)
            now = 0.0  # (opening it took time: the RPC's clock starts at the send)
        try:
            # (rpc_timeout None: as long as it takes, as conn.read(None), but rerouted.)
            pool.send_watched(conn, frames, self.rpc_timeout or _FOREVER, journal, expect,
                              grace, now)
            try:
                frame = await conn.stream.read()
            except ConnectionClosed as exc:  # (the watchdog may have closed it)
                raise caused(conn.lost(exc, conn.timed_out), exc)
            message = frame.message
            if type(message) is not AppendResponse and not isinstance(message, AppendResponse):
                conn.checked(frame)  # the peer's ErrorFrame: its typed StatusError
                raise ProtocolError(f"{endpoint} answered an append with {type(message).__name__}")
            if message.status != Status.OK:
                # The broker may have answered before reading our whole stream (then it
                # closes): the connection is not known to be on a frame boundary.
                conn.broken = True
            return message
        except Unavailable as unavailable:  # (its own name: mypyc types `exc` by the first clause)
            conn.abort()
            raise caused(_Ambiguous(unavailable), unavailable)
        except BaseException:
            conn.abort()
            raise
        finally:
            pool.finish(conn)

    @staticmethod
    async def _drain_or_answer(conn: Connection, answer: asyncio.Future[Any]) -> bool:
        """Drain the writer; True if the broker answered first (stop sending)."""
        if answer.done():
            return True
        drain = asyncio.ensure_future(conn.drain())
        done, _ = await asyncio.wait({drain, answer}, return_when=asyncio.FIRST_COMPLETED)
        if drain in done:
            try:
                drain.result()
            except Unavailable:
                # The broker may have closed after answering; let the answer decide.
                return True
            return False
        drain.cancel()
        return True

    # -- read -----------------------------------------------------------------------

    def read(self, journal: str, offset: int = 0, *, block: bool = False, follow: bool = False,
             end_offset: int = 0, from_store: bool = False,
             unverified_reads_risk_corruption: bool = False) -> Reader:
        """An async iterator of (offset, bytes). See Reader for the offset-jump rule.
        `from_store` fragments are proven by their SHA-1 unless
        `unverified_reads_risk_corruption` (docs/integrity.md)."""
        validate_journal_name(journal, "journal")
        return Reader(self, journal, offset, block=block, follow=follow, end_offset=end_offset,
                      from_store=from_store,
                      unverified_reads_risk_corruption=unverified_reads_risk_corruption)

    async def write_head(self, journal: str) -> int:
        """The journal's current write head (a non-blocking metadata read at -1)."""
        reader = Reader(self, journal, -1, metadata_only=True)
        return await reader.probe()

    async def reset_head(self, journal: str) -> AppendResult:
        """Gazette's reset-head: an empty append at the write head with suspend=keep, so
        the journal continues at the highest offset any store or replica has."""
        head = await self.write_head(journal)
        return await self.append(journal, b"", offset=head, suspend="keep")

    async def suspend(self, journal: str, *, force: bool = False) -> AppendResult:
        """Ask the journal to suspend: if fully flushed (default) or now (`force`)."""
        return await self.append(journal, b"", suspend="now" if force else "if-flushed")
