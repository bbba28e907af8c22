"""AppendService: many small appends become few transactional appends, per journal.

Theory of operation (after Gazette's broker/client/append_service.go):

* Each journal has a FIFO of *batches* and, while it has any, one writer task. A
  message joins the tail batch unless that batch is in flight or full; the writer
  appends the head batch as one transaction, retrying until it succeeds, then moves on.
  Messages to one journal therefore commit in the order `append()` accepted them, and
  everything accepted while a batch is in flight goes out together in the next one.
* Memory is bounded by `max_buffered_bytes` over all journals: `append()` waits for
  room (backpressure) while the cluster is answering. It also yields to the loop after
  every YIELD_BYTES accepted (before accepting the next message, so a cancelled append
  never leaves its message accepted), so a producer loop that awaits nothing else still
  lets the writers send batches and take answers while it produces.
* While the cluster is unreachable (a batch failed with Unavailable), the journal's
  batches are *spilled*: written whole to `spill_dir` and dropped from memory, so
  writers keep going at disk speed. The writer keeps retrying the head and drains the
  disk queue in order once the cluster is back. Spilled batches survive a crash of the
  process: a new AppendService over the same directory appends them first.
* Retries never stop except on the statuses Gazette also gives up on (digest §7):
  JOURNAL_NOT_FOUND, NOT_ALLOWED, INDEX_HAS_GREATER_OFFSET, FRAGMENT_STORE_UNHEALTHY,
  REGISTER_MISMATCH, WRONG_APPEND_OFFSET (and BAD_REQUEST). Those fail the batch's
  futures; a refused spilled batch is moved to `spill_dir/failed/`, never deleted.

Delivery semantics. By default delivery is *at-least-once*, as in Gazette's
AppendService: a batch whose outcome is unknown — the commit was sent, then the answer
was lost or timed out, or the broker answered COMMIT_UNKNOWN (`CommitUnknown`) — is
appended again, so if the first attempt did land, the batch's messages are in the
journal twice. This is never silent: every such re-send is counted in
`commit_unknown_resends`, and readers that need exactly-once de-duplicate by message
id (as Gazette's consumers do with message UUIDs). With `at_least_once=False` the
service does not re-send such a batch: its futures fail with `CommitUnknown` (each
message is then in the journal at most once, and the caller decides). The plain
`Client.append` never re-sends after its commit was sent (unless it carries an
explicit offset); the chaos writers use it, which is why they see no duplicates.

Exactly-once (`exactly_once=True, producer=NAME`, docs/exactly-once.md): the service
starts a new generation of the producer (persisted under `state_dir`), keeps one
history per journal, and gives every batch the next transaction number of its
journal's history when it is first sent. A batch whose outcome is unknown is re-sent
under the same number, and the primary answers it with the original commit if it had
landed: no duplicates and no `commit_unknown_resends`. Limitation: batches spilled to
disk and appended by a *later* run get that run's generation, so a batch that was in
flight when the process crashed may land twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

from protocol import Status, validate_journal_name
from protocol.errors import CommitUnknown, QuireError, StatusError, Unavailable

from .producer import History, Producer, TxnId
from .results import AppendResult
from .spill import SpillDir

if TYPE_CHECKING:
    from .client import Client

FATAL_STATUSES = frozenset({
    Status.JOURNAL_NOT_FOUND, Status.NOT_ALLOWED, Status.INDEX_HAS_GREATER_OFFSET,
    Status.FRAGMENT_STORE_UNHEALTHY, Status.REGISTER_MISMATCH, Status.WRONG_APPEND_OFFSET,
    Status.BAD_REQUEST, Status.TXN_OUT_OF_ORDER, Status.TXN_SUPERSEDED,
    Status.PRODUCER_GENERATION_RETIRED, Status.HISTORY_CLOSED,
})
BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
YIELD_BYTES = 256 << 10
"""append() yields to the loop once this many bytes were accepted since it last did, so
a producer loop that awaits nothing else still lets the writers put batches on the wire
and take their answers while it goes on (otherwise one batch would grow until the
producer waits)."""


def _future_factory(loop: asyncio.AbstractEventLoop) -> Callable[[], asyncio.Future[AppendResult]]:
    """`loop.create_future` — one future per message, so on asyncio's own loop (whose
    create_future is a Python method that only does this) the Future class is called
    directly; uvloop's create_future is already native."""
    if type(loop).create_future is asyncio.BaseEventLoop.create_future:
        return functools.partial(asyncio.Future, loop=loop)
    return loop.create_future


def _unbound_future() -> asyncio.Future[AppendResult]:
    raise RuntimeError("AppendService.start() sets the loop's future factory")


class ServiceClosed(QuireError):
    """The AppendService was closed before the message could be appended."""


class _Batch:
    __slots__ = ("seq", "buf", "path", "size", "waiters", "ends", "in_flight", "done", "txn",
                 "unknown")

    def __init__(self, seq: int, loop: asyncio.AbstractEventLoop) -> None:
        self.seq = seq
        self.buf: bytearray | bytes | None = bytearray()
        self.path: Path | None = None
        self.size = 0
        self.waiters: list[asyncio.Future[AppendResult]] = []
        self.ends: list[int] = []
        """Where each waiter's message ends in `buf` (it begins where the previous ends)."""
        self.in_flight = False
        self.done: asyncio.Future[None] = loop.create_future()
        self.txn: TxnId | None = None
        """exactly_once: this batch's identifier, fixed at its first send."""
        self.unknown = False
        """An attempt's outcome was unknown: it may have landed (never reuse its txn)."""


class _Journal:
    __slots__ = ("name", "batches", "writer", "spilling", "failures", "history")

    def __init__(self, name: str) -> None:
        self.name = name
        self.history: History | None = None
        self.batches: collections.deque[_Batch] = collections.deque()
        self.writer: asyncio.Task[None] | None = None
        self.spilling = False
        self.failures = 0


class AppendService:
    def __init__(self, client: Client, *, spill_dir: str | Path | None = None,
                 max_batch_bytes: int = 4 << 20, max_buffered_bytes: int = 64 << 20,
                 attempt_timeout: float = 2.0, max_backoff: float = 5.0,
                 at_least_once: bool = True, exactly_once: bool = False,
                 producer: str | Producer | None = None,
                 state_dir: str | Path | None = None) -> None:
        """`exactly_once`: identify every batch (needs `producer`, a name whose
        generation is persisted under `state_dir`, or a started Producer)."""
        self.client = client
        if exactly_once and producer is None:
            raise ValueError("exactly_once needs a producer name")
        self.producer: Producer | None = None
        if exactly_once:
            self.producer = producer if isinstance(producer, Producer) \
                else Producer.start(str(producer), state_dir)
        self.spill = SpillDir(spill_dir) if spill_dir is not None else None
        self.max_batch_bytes = max_batch_bytes
        self.max_buffered_bytes = max_buffered_bytes
        self.attempt_timeout = attempt_timeout
        """How long one batch append may retry routing hiccups before the service backs
        off (and, if the cluster is unreachable, starts spilling)."""
        self.max_backoff = max_backoff
        self.at_least_once = at_least_once
        """Re-send a batch whose outcome is unknown (it may then land twice); False:
        fail its futures with CommitUnknown instead (see the module docstring)."""
        self.commit_unknown_resends = 0
        """Batches re-sent after an attempt whose outcome was unknown (possible duplicates)."""
        self.memory = 0
        """Bytes of accepted content held in memory."""
        self._journals: dict[str, _Journal] = {}
        self._seq = 0
        self._room = asyncio.Event()
        self._create_future: Callable[[], asyncio.Future[AppendResult]] = _unbound_future
        """The running loop's create_future, once start() has seen the loop."""
        self._started = False
        self._closed = False
        self._unyielded = 0
        """Bytes accepted since append() last yielded to the loop (YIELD_BYTES)."""

    # -- public ---------------------------------------------------------------------

    async def start(self) -> AppendService:
        """Re-queue batches a previous run spilled (called by the first append too)."""
        if self._started:
            return self
        self._started = True
        loop = asyncio.get_running_loop()
        self._create_future = _future_factory(loop)
        if self.spill is not None:
            for journal, seq, path, size in self.spill.scan():
                batch = _Batch(seq, loop)
                batch.buf, batch.path, batch.size = None, path, size
                self._journal(journal).batches.append(batch)
                self._seq = max(self._seq, seq + 1)
            for q in self._journals.values():
                self._wake(q)
        return self

    async def append(self, journal: str, data: bytes | bytearray | memoryview) -> asyncio.Future[AppendResult]:
        """Queue `data` (one or more whole messages) for `journal`.

        Returns at once (after backpressure) with a future resolving to the message's
        own span once its batch committed, or to the batch's error if it was refused.
        """
        q = self._journals.get(journal)
        if q is None or self._closed or not self._started:
            q = await self._first_of(journal)
        size = len(data)
        if self._unyielded >= YIELD_BYTES or (
                self.memory and self.memory + size > self.max_buffered_bytes):
            await self._wait_turn(q, size)  # no coroutine per message otherwise
        batch = q.batches[-1] if q.batches else None
        # A batch that was sent once is frozen (bytes, or spilled): a re-send after an
        # unknown outcome must carry exactly what the first attempt carried.
        if (batch is None or batch.in_flight or not isinstance(batch.buf, bytearray)
                or (batch.size and batch.size + size > self.max_batch_bytes)):
            batch = self._new_batch()
            q.batches.append(batch)
        future: asyncio.Future[AppendResult] = self._create_future()
        batch.waiters.append(future)
        batch.buf += data  # type: ignore[operator]  (a bytearray: checked above)
        batch.size += size
        batch.ends.append(batch.size)
        self.memory += size
        self._unyielded += size
        writer = q.writer
        if writer is None or writer.done():
            self._wake(q)
        return future

    async def _wait_turn(self, q: _Journal, size: int) -> None:
        """Before a message is accepted (so a cancel here accepts nothing): wait for room
        (backpressure), or give the writers their turn (YIELD_BYTES)."""
        self._unyielded = 0
        if self.memory and self.memory + size > self.max_buffered_bytes:
            await self._make_room(q, size)
        else:
            await asyncio.sleep(0)
        if self._closed:
            raise ServiceClosed("append after close()")

    async def _first_of(self, journal: str) -> _Journal:
        """append()'s slow path: closed, not started, or a journal not seen yet."""
        if self._closed:
            raise ServiceClosed("append after close()")
        if not self._started:
            await self.start()
        q = self._journals.get(journal)
        if q is None:
            validate_journal_name(journal, "journal")
            q = self._journal(journal)
        return q

    async def flush(self, journal: str | None = None, timeout: float | None = None) -> None:
        """Wait until everything accepted so far was committed (or refused)."""
        queues = [self._journals[journal]] if journal in self._journals else (
            [] if journal is not None else list(self._journals.values()))
        pending = [q.batches[-1].done for q in queues if q.batches]
        if pending:
            await asyncio.wait_for(asyncio.gather(*(asyncio.shield(p) for p in pending)), timeout)

    @property
    def pending_batches(self) -> int:
        return sum(len(q.batches) for q in self._journals.values())

    async def close(self, timeout: float | None = None) -> None:
        """Flush, then stop. If the flush times out, unsent batches are spilled (kept
        for the next run) or, without a spill dir, failed with ServiceClosed."""
        if self._closed:
            return
        self._closed = True
        self._room.set()
        try:
            await self.flush(timeout=timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            await self._stop_writers()

    async def __aenter__(self) -> AppendService:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------------

    def _journal(self, name: str) -> _Journal:
        q = self._journals.get(name)
        if q is None:
            q = self._journals[name] = _Journal(name)
        return q

    def _new_batch(self) -> _Batch:
        self._seq += 1
        return _Batch(self._seq, asyncio.get_running_loop())

    def _wake(self, q: _Journal) -> None:
        if q.batches and (q.writer is None or q.writer.done()):
            q.writer = asyncio.get_running_loop().create_task(self._write(q),
                                                              name=f"append:{q.name}")

    async def _make_room(self, q: _Journal, size: int) -> None:
        # One message larger than the whole budget is still accepted when nothing else
        # is held, or it could never be sent.
        while self.memory and self.memory + size > self.max_buffered_bytes and not self._closed:
            if self.spill is not None:
                for other in self._journals.values():
                    if other.spilling:
                        self._spill(other)
                if self.memory + size <= self.max_buffered_bytes:
                    return
            self._room.clear()
            await self._room.wait()

    def _release(self, nbytes: int) -> None:
        self.memory -= nbytes
        self._room.set()

    def _spill(self, q: _Journal) -> None:
        """Move every batch of `q` that is not being sent from memory to disk."""
        assert self.spill is not None
        for batch in q.batches:
            if batch.buf is None or batch.in_flight or not batch.size:
                continue
            batch.path = self.spill.write(q.name, batch.seq, batch.buf)
            batch.buf = None
            self._release(batch.size)

    async def _write(self, q: _Journal) -> None:
        while q.batches:
            batch = q.batches[0]
            batch.in_flight = True
            try:
                result = await self._send(q.name, batch)
            except StatusError as exc:
                batch.in_flight = False
                if exc.status in FATAL_STATUSES or (isinstance(exc, CommitUnknown)
                                                    and not self.at_least_once
                                                    and batch.txn is None):
                    if batch.txn is not None and q.history is not None \
                            and not isinstance(exc, CommitUnknown) and not batch.unknown:
                        q.history.unused(batch.txn)  # refused: nothing was written
                    self._finish(q, batch, error=exc)
                    continue
                if isinstance(exc, CommitUnknown):
                    batch.unknown = True
                    if batch.txn is None:
                        self.commit_unknown_resends += 1  # at-least-once: it may land twice
                q.failures += 1
                if isinstance(exc, Unavailable) and self.spill is not None:
                    q.spilling = True
                    self._spill(q)
                await asyncio.sleep(self._backoff(q))
                continue
            except (OSError, QuireError) as exc:  # a protocol error or unreadable spill file
                batch.in_flight = False
                q.failures += 1
                if q.failures > 20:
                    self._finish(q, batch, error=exc)
                    continue
                await asyncio.sleep(self._backoff(q))
                continue
            q.failures = 0
            q.spilling = False
            self._finish(q, batch, result=result)

    def _backoff(self, q: _Journal) -> float:
        return min(self.max_backoff, BACKOFF[min(q.failures - 1, len(BACKOFF) - 1)])

    async def _send(self, journal: str, batch: _Batch) -> AppendResult:
        if self.producer is not None and batch.txn is None:
            q = self._journals[journal]
            if q.history is None:
                q.history = self.producer.history()
            batch.txn = q.history.next()
        if batch.buf is not None:
            if isinstance(batch.buf, bytearray):
                batch.buf = bytes(batch.buf)  # frozen: nothing joins an in-flight batch
            return await self.client.append(journal, batch.buf, retry_timeout=self.attempt_timeout,
                                            txn=batch.txn)
        assert batch.path is not None
        with open(batch.path, "rb") as f:
            return await self.client.append(journal, f, retry_timeout=self.attempt_timeout,
                                            txn=batch.txn)

    def _finish(self, q: _Journal, batch: _Batch, *, result: AppendResult | None = None,
                error: BaseException | None = None) -> None:
        q.batches.popleft()
        if batch.buf is not None:
            self._release(batch.size)
            batch.buf = None
        if batch.path is not None and self.spill is not None:
            if error is None:
                self.spill.remove(batch.path)
            else:
                self.spill.quarantine(q.name, batch.path)
        if error is not None:
            for future in batch.waiters:
                if not future.done():
                    future.set_exception(error)
        else:
            assert result is not None
            name, at, commit, registers = q.name, result.begin, result.commit, result.registers
            begin = at
            for future, end in zip(batch.waiters, batch.ends):
                end += at
                if not future.done():
                    future.set_result(AppendResult(journal=name, begin=begin, end=end,
                                                   commit=commit, registers=registers))
                begin = end
        if not batch.done.done():
            batch.done.set_result(None)

    async def _stop_writers(self) -> None:
        for q in list(self._journals.values()):
            if q.writer is not None and not q.writer.done():
                q.writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await q.writer
            for batch in q.batches:
                if self.spill is not None and batch.buf is not None and batch.size:
                    batch.path = self.spill.write(q.name, batch.seq, batch.buf)
                    self._release(batch.size)
                    batch.buf = None
                reason = (f"kept in {batch.path}, appended by the next AppendService "
                          "over this spill dir") if batch.path else "not appended"
                for future in batch.waiters:
                    if not future.done():
                        future.set_exception(ServiceClosed(f"closed before commit; {reason}"))
                if not batch.done.done():
                    batch.done.set_result(None)
        self._journals.clear()
