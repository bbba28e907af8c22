"""Running one shard on this member: as primary (fence, restore, read, handle, commit) or
as a hot standby (tail the recovery log into the local store). The asyncio adapter
around plan.Lifecycle and plan.CommitPolicy.

Primary, in the seed's order:
1. fence the recovery log (a fence record that sets the `shard-author` register);
2. restore the local store: reuse the local copy if it is at least as new as the newest
   snapshot, else fetch that snapshot; then replay the log up to the fence;
3. read every source from its checkpointed offset (or its min_offset), blocking, through
   the fragment store for persisted content;
4. call the app per message;
5. commit at a message boundary when the policy says so: the write batch (state +
   read-through offsets + the output ledger) is appended to the recovery log under the
   fence, then written to RocksDB atomically; the transaction's outputs are then
   appended as identified appends, awaited before the next commit (outputs.py);
6. on release (reassignment, SIGTERM): commit what is open and stop.

Between 2 and 3, a new primary re-sends the last committed transaction's outputs under
their own generation (the broker drops those that landed), then takes the next one:
end-to-end exactly-once outputs (docs/exactly-once.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, field

import aetcd

from protocol import ProcessId
from protocol.errors import StatusError, TxnSuperseded
from protocol.logs import get_logger
from protocol.shard import ShardSpec, ShardState, ShardStatus, SourceStatus
from quire.client import Client, LineFramer
from topology.shards import publish_needs

from . import metrics, snapshot
from .app import App, Message, Shard
from .faults import fault_point
from .outputs import LEDGER_KEY, Intent, OutputLedger, producer_name
from .plan import CommitPolicy, Lifecycle
from .recoverylog import LogWriter, RecordReader, fence, replay
from .store import Store

__all__ = ["ShardRunner"]

log = get_logger(__name__)

_Chunk = tuple[str, int, bytes]
STALL = 3.0
"""Seconds without a byte from a source before its write head is checked."""


async def cancel_all(tasks: list[asyncio.Future], timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """Cancel and reap tasks, cancelling again while any survives (bounded).

    Python 3.11's asyncio.wait_for can swallow a cancellation that races with the
    awaited read completing; a blocked source reader would then keep following its
    journal and a plain gather() would wait forever, wedging the shard's release."""
    deadline = time.monotonic() + timeout
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.2)
        if pending and time.monotonic() > deadline:
            log.error("tasks survived cancellation; abandoning them",
                      tasks=[getattr(t, "get_name", lambda: "?")() for t in pending])
            return
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" noise


@dataclass
class ShardRunner:
    client: Client
    etcd: aetcd.Client
    root: str
    me: ProcessId
    spec: ShardSpec
    app: App
    data_dir: str
    snapshot_interval: float = 10.0
    selector_refresh: float = 10.0
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    notice: asyncio.Event = field(default_factory=asyncio.Event)
    offsets: dict[str, int] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)
    log_offset: int = 0
    transactions: int = 0
    store: Store | None = None
    ledger: OutputLedger | None = None
    _snapshotting: asyncio.Task[None] | None = None
    _next: dict[str, int] = field(default_factory=dict)
    _progress: dict[str, int] = field(default_factory=dict)
    _last_snapshot: float = 0.0

    @property
    def db_path(self) -> str:
        return os.path.join(self.data_dir, self.spec.id.replace("/", "%"), "db")

    def status(self) -> ShardStatus:
        return ShardStatus(
            id=self.spec.id, member=str(self.me), state=self.lifecycle.state,
            sources=tuple(SourceStatus(journal=j, offset=o, write_head=max(o, self.heads.get(j, 0)))
                          for j, o in sorted(self.offsets.items())),
            log_offset=self.log_offset, transactions=self.transactions,
            message=self.lifecycle.reason, updated=time.time())

    # -- restore -------------------------------------------------------------------------

    async def _store_url(self) -> str:
        entry = await self.client.get_journal(self.spec.recovery_log)
        stores = entry.spec.fragment.stores
        return stores[0] if stores else ""

    async def _open_restored(self) -> Store:
        """The local store, replaced by the newest snapshot if that is newer."""
        url = await self._store_url()
        local = Store(self.db_path) if os.path.exists(self.db_path) else None
        latest = await asyncio.to_thread(snapshot.latest_snapshot, url, self.spec.id) if url else None
        if latest is not None and (local is None or local.log_offset < latest[0]):
            if local is not None:
                local.close()
            await asyncio.to_thread(snapshot.fetch_snapshot, url, latest[1], self.db_path)
            local = Store(self.db_path)
            log.info("snapshot restored", shard=self.spec.id, log_offset=latest[0])
        return local if local is not None else Store(self.db_path)

    def _replay_progress(self, n: int) -> None:
        metrics.REPLAY_BYTES.labels(self.spec.id).inc(n)

    # -- primary -------------------------------------------------------------------------

    async def run_primary(self, author: str, stop: asyncio.Event) -> None:
        shard_id = self.spec.id
        self.lifecycle.to(ShardState.BACKFILL)
        fence_end = await fence(self.client, self.spec.recovery_log, author)
        store = self.store = await self._open_restored()
        try:
            begin = store.log_offset
            replayed = await replay(self.client, self.spec.recovery_log, begin, fence_end,
                                    store.apply, self._replay_progress)
            log.info("recovery log replayed", shard=shard_id, begin=begin, end=fence_end,
                     bytes=replayed)
            self.log_offset = fence_end
            self.ledger = OutputLedger(producer_name(shard_id), store.db.get(LEDGER_KEY))
            resend = self.ledger.start()
            if resend:
                await self._send(resend, resend=True)
                log.info("re-sent the last transaction's outputs", shard=shard_id,
                         appends=len(resend), generation=resend[0].generation,
                         next_generation=self.ledger.generation)
            await self._serve(store, LogWriter(self.client, self.spec.recovery_log, author), stop)
        finally:
            if self._snapshotting is not None:
                with contextlib.suppress(BaseException):
                    await self._snapshotting
            store.close()
            self.store = None

    async def _selected(self) -> dict[str, int]:
        """Every source journal (named, or matched by a selector) -> its min_offset."""
        out: dict[str, int] = {}
        for src in self.spec.sources:
            names = [src.journal] if src.journal else \
                [e.spec.name for e in await self.client.list_journals(src.parsed_selector() or "")]
            for name in names:
                if name != self.spec.recovery_log:
                    out[name] = max(src.min_offset, out.get(name, 0))
        return out

    async def _sources(self, store: Store) -> dict[str, int]:
        stored = store.offsets()
        return {name: max(stored.get(name, 0), start)
                for name, start in (await self._selected()).items()}

    async def _read(self, journal: str, offset: int, queue: asyncio.Queue[_Chunk]) -> None:
        """Follow a source from `offset`, re-issuing a blocked read that missed new content
        (the write head moved past us while no byte came for STALL seconds)."""
        while True:
            follow = asyncio.create_task(self._follow(journal, offset, queue))
            while not follow.done():
                seen = self._progress.get(journal, 0)
                done, _ = await asyncio.wait({follow}, timeout=STALL)
                if done or self._progress.get(journal, 0) != seen or queue.full():
                    continue  # moving, or waiting on the handler (back-pressure)
                at = self._next.get(journal, offset)
                try:
                    head = await self.client.write_head(journal)
                except StatusError:
                    continue
                if head > at and self._progress.get(journal, 0) == seen:
                    log.warning("source read stalled behind the write head; re-issuing",
                                shard=self.spec.id, journal=journal, offset=at, write_head=head)
                    await cancel_all([follow])
                    offset = at
                    break
            else:
                follow.result()
                return

    async def _follow(self, journal: str, offset: int, queue: asyncio.Queue[_Chunk]) -> None:
        async with self.client.read(journal, offset, block=True, follow=True) as reader:
            async for at, data in reader:
                self.heads[journal] = max(reader.write_head, at + len(data))
                await queue.put((journal, at, data))
                # Only after the chunk is queued: a re-issued read resumes right after it.
                self._next[journal] = at + len(data)
                self._progress[journal] = self._progress.get(journal, 0) + 1

    async def _serve(self, store: Store, writer: LogWriter, stop: asyncio.Event) -> None:
        shard_id, app = self.spec.id, self.app
        self.offsets = await self._sources(store)
        shard = Shard(id=shard_id, spec=self.spec, store=store)
        app.init(shard)
        self.lifecycle.to(ShardState.PRIMARY)
        self._last_snapshot = time.monotonic()
        log.info("shard primary", shard=shard_id, offsets=self.offsets)
        queue: asyncio.Queue[_Chunk] = asyncio.Queue(maxsize=256)
        framers = {j: LineFramer() for j in self.offsets}
        policy = CommitPolicy(self.spec.checkpoint_interval)
        handled = metrics.MESSAGES.labels(shard_id)
        handle, decode = app.handle, app.decode
        stopping = asyncio.ensure_future(stop.wait())
        noticed = asyncio.ensure_future(self.notice.wait())
        readers = [asyncio.create_task(self._read(j, o, queue), name=f"read-{shard_id}-{j}")
                   for j, o in self.offsets.items()]

        async def discover() -> None:
            """Journals that start matching a selector source later are read from their
            min_offset (re-listed every `selector_refresh` seconds)."""
            while True:
                await asyncio.sleep(self.selector_refresh)
                try:
                    found = await self._selected()
                except StatusError as exc:
                    log.warning("selector refresh failed", shard=shard_id, error=str(exc))
                    continue
                for name, start in sorted(found.items()):
                    if name not in framers:
                        framers[name] = LineFramer()
                        self.offsets[name] = start
                        readers.append(asyncio.create_task(self._read(name, start, queue),
                                                           name=f"read-{shard_id}-{name}"))
                        log.info("new source journal", shard=shard_id, journal=name, offset=start)

        helpers = [asyncio.create_task(discover())] if any(s.selector for s in self.spec.sources) else []
        try:
            while not stop.is_set():
                if self.notice.is_set():
                    self.notice.clear()
                    policy.notice = True
                    noticed = asyncio.ensure_future(self.notice.wait())
                idle = False
                item: _Chunk | None = None
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    getter = asyncio.ensure_future(queue.get())
                    budget = policy.wait_budget(time.monotonic())
                    done, _ = await asyncio.wait({getter, stopping, noticed, *readers},
                                                 timeout=budget, return_when=asyncio.FIRST_COMPLETED)
                    if getter in done:
                        item = getter.result()
                    else:
                        getter.cancel()
                        idle = not done
                    for r in readers:
                        if r.done() and not r.cancelled() and r.exception() is not None:
                            raise r.exception()  # type: ignore[misc]
                n = 0
                while item is not None:
                    journal, at, data = item
                    framer = framers[journal]
                    lines = framer.feed(at, data)
                    for offset, line in lines:
                        if len(line) > 1:
                            handle(shard, Message(journal, offset, decode(line), line))
                    n += len(lines)
                    self.offsets[journal] = framer.next_offset
                    if n > 4096:
                        break
                    try:
                        item = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        item = None
                if n:
                    handled.inc(n)
                    policy.on_message(time.monotonic())
                if policy.due(time.monotonic(), store.pending, idle):
                    await self._commit(shard, store, writer, policy)
            if policy.opened is not None or store.pending:
                await self._commit(shard, store, writer, policy)
        finally:
            await cancel_all([*helpers, *readers, stopping, noticed])

    async def _commit(self, shard: Shard, store: Store, writer: LogWriter,
                      policy: CommitPolicy) -> None:
        started = time.monotonic()
        self.app.before_commit(shard)
        snap_due = policy.notice or started - self._last_snapshot >= self.snapshot_interval
        assert self.ledger is not None
        outputs, shard.outputs = shard.outputs, []
        entry, intents = self.ledger.commit(outputs)
        ops = store.take(dict(self.offsets))
        ops.append(entry)  # the outputs' intents commit with the state they reflect
        end = await writer.append(ops)
        store.apply(ops, end)
        self.ledger.committed(entry)
        self.log_offset = end
        if intents:
            fault_point("after-commit")
            await self._send(intents)
            fault_point("after-outputs")
        self.app.on_commit(shard)
        policy.committed()
        self.transactions += 1
        metrics.TXNS.labels(self.spec.id).inc()
        metrics.TXN_SECONDS.labels(self.spec.id).observe(time.monotonic() - started)
        for j, o in self.offsets.items():
            metrics.LAG_BYTES.labels(self.spec.id, j).set(max(0, self.heads.get(j, o) - o))
        if snap_due and (self._snapshotting is None or self._snapshotting.done()):
            self._last_snapshot = started
            self._snapshotting = asyncio.create_task(self._snapshot(store, end, dict(self.offsets)))

    async def _send(self, intents: list[Intent], resend: bool = False) -> None:
        """Append each intent as an identified append (the client re-sends until an
        authoritative answer). A re-sent intent the broker knows a later txn of was acted
        on (TXN_SUPERSEDED) landed; any other refusal fails the shard."""
        assert self.ledger is not None
        producer = self.ledger.producer

        async def one(i: Intent) -> None:
            try:
                await self.client.append(i.journal, i.data, txn=i.txn_id(producer))
            except TxnSuperseded:
                if not resend:
                    raise
                log.info("re-sent output already superseded (it landed)", shard=self.spec.id,
                         journal=i.journal, txn=i.txn)

        await asyncio.gather(*(one(i) for i in intents))

    async def _snapshot(self, store: Store, log_offset: int, offsets: dict[str, int]) -> None:
        try:
            url = await self._store_url()
            if not url:
                return
            target = tempfile.mkdtemp(prefix="snap-", dir=self.data_dir)
            os.rmdir(target)
            store.checkpoint(target)
            key = await asyncio.to_thread(snapshot.upload_snapshot, url, self.spec.id, target, log_offset)
            await asyncio.to_thread(snapshot.prune_snapshots, url, self.spec.id)
            # Pruning may now drop what no snapshot or checkpoint needs any more.
            await publish_needs(self.etcd, self.root, self.spec.id,
                                {self.spec.recovery_log: log_offset, **offsets})
            metrics.SNAPSHOTS.labels(self.spec.id).inc()
            log.info("snapshot uploaded", shard=self.spec.id, key=key, log_offset=log_offset)
        except (OSError, StatusError, ValueError) as exc:
            log.warning("snapshot failed", shard=self.spec.id, error=str(exc))

    # -- standby -------------------------------------------------------------------------

    async def run_standby(self, stop: asyncio.Event) -> None:
        """Tail the recovery log into the local store until stopped (then close it)."""
        self.lifecycle.to(ShardState.BACKFILL)
        store = self.store = await self._open_restored()
        try:
            head = await self.client.write_head(self.spec.recovery_log)
            records = RecordReader(store.log_offset)
            self.log_offset = store.log_offset
            if self.log_offset >= head:
                self.lifecycle.to(ShardState.STANDBY)
            stopping = asyncio.ensure_future(stop.wait())
            async with self.client.read(self.spec.recovery_log, store.log_offset, block=True,
                                        follow=True) as reader:
                it = reader.__aiter__()
                nxt: asyncio.Future[tuple[int, bytes]] | None = None
                try:
                    while not stop.is_set():
                        nxt = asyncio.ensure_future(it.__anext__())
                        done, _ = await asyncio.wait({nxt, stopping},
                                                     return_when=asyncio.FIRST_COMPLETED)
                        if nxt not in done:
                            break
                        at, data = nxt.result()
                        for record, record_end in records.feed(at, data):
                            if not record.fence:
                                store.apply(record.ops, record_end)
                        self.log_offset = records.offset
                        self._replay_progress(len(data))
                        if self.lifecycle.state is ShardState.BACKFILL and records.offset >= head:
                            self.lifecycle.to(ShardState.STANDBY)
                finally:
                    # Reaped on every exit (a stop, or this task cancelled in the wait)
                    # before the reader closes: closing it while that read still runs
                    # raised "aclose(): asynchronous generator is already running".
                    if nxt is not None:
                        await cancel_all([nxt])
            stopping.cancel()
        finally:
            store.close()
            self.store = None
