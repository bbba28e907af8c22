"""KeySpace: a local mirror of everything under `<root>/`, kept current by an etcd watch.

Theory of operation (Gazette's keyspace/key_space.go):

- `async with KeySpace(client, root)` loads the prefix with one range read (its header
  revision is the mirror's revision) and then watches from revision + 1 in a task the
  KeySpace owns. Each watch response is applied as one batch, so a multi-key transaction
  is never seen half-applied; `revision` is the header revision of the last response.
- A compacted start revision, a cancelled watch or a broken stream (etcd restarted, the
  connection dropped) ends the watch; the KeySpace then re-lists the prefix and watches
  again, with bounded exponential backoff. A re-list replaces the mirror atomically.
- `wait_for_revision` serves peers that saw a later revision (route headers). The
  revision may belong to a write outside our prefix that no event will ever announce,
  so it also reads the prefix's keys and mod revisions: when they match the mirror, the
  mirror is complete through that read's revision (see `_catch_up`).
- Values that fail to decode are logged and skipped: one bad key must not blind a broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aetcd
import msgspec
import structlog
from aetcd import rpc

from protocol import Etcd, JournalSpec, ProcessId, Route

from .etcd import (
    MalformedKey,
    assign_prefix,
    journals_prefix,
    leader_key,
    members_prefix,
    parse_assignment_key,
    parse_journal_key,
    parse_member_key,
)
from .membership import BrokerSpec
from .watch import WatchEnded, watch_events

__all__ = ["Assignment", "BrokerSpec", "JournalEntry", "KeySpace", "LeaderEntry", "MemberEntry"]

log = structlog.get_logger()

MAX_BACKOFF = 2.0
CATCH_UP_AFTER = 0.05
"""Seconds a revision wait gives the watch before reading the prefix back."""


@dataclass(frozen=True, slots=True)
class JournalEntry:
    spec: JournalSpec
    mod_revision: int
    create_revision: int


@dataclass(frozen=True, slots=True)
class MemberEntry:
    spec: BrokerSpec
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class Assignment:
    journal: str
    member: ProcessId
    slot: int
    value: Route | None
    """The route the primary advertised into this assignment; None until it did."""
    mod_revision: int
    create_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class LeaderEntry:
    member: ProcessId
    mod_revision: int
    create_revision: int
    lease: int


class KeySpace:
    def __init__(self, client: aetcd.Client, root: str) -> None:
        self._client = client
        self.root = root.rstrip("/")
        self._prefix = (self.root + "/").encode()
        self.revision = 0
        """Revision through which the mirror is complete."""
        self.changed_revision = 0
        """Revision of the last batch that changed content (progress does not count)."""
        self.etcd = Etcd()
        """cluster/member ids and raft term from the last header, for route headers."""
        self.journals: dict[str, JournalEntry] = {}
        self.members: dict[ProcessId, MemberEntry] = {}
        self.leader: LeaderEntry | None = None
        self._assign: dict[str, dict[tuple[ProcessId, int], Assignment]] = {}
        self._sorted: dict[str, list[Assignment]] = {}
        """journal -> its assignments sorted, kept until one of them changes (every
        coordinator resolves every journal on each change: thousands of sorts)."""
        self._of: dict[ProcessId, dict[tuple[str, int], Assignment]] = {}
        """member -> its assignments (an index of `_assign`, so a member's own are found
        without scanning every journal's)."""
        self.on_change: list[Callable[[KeySpace], None]] = []
        """Sync callbacks run after every applied batch that changed content."""
        self._applied = asyncio.Event()
        """Replaced (after being set) on every applied batch: a broadcast without a lock."""
        self._task: asyncio.Task[None] | None = None
        self._mods: dict[bytes, int] = {}
        """Every key under the prefix (decodable or not) -> its ModRevision."""
        self._catching_up: asyncio.Future[None] | None = None
        """The prefix read under way (`_catch_up`): concurrent waiters share it."""
        self.touched: set[str] | None = None
        """For `on_change` callbacks: the journals whose spec or assignments the batch
        changed, or None when anything may have (a (re)load, a member or leader key), so
        a follower can re-examine those journals alone, not every journal per change."""

    # -- reading ----------------------------------------------------------------------------

    def assignments(self, journal: str) -> list[Assignment]:
        """A journal's assignments sorted by slot (then member)."""
        cached = self._sorted.get(journal)
        if cached is None:
            cached = self._sorted[journal] = sorted(self._assign.get(journal, {}).values(),
                                                    key=lambda a: (a.slot, a.member))
        return list(cached)

    def assignments_of(self, member: ProcessId) -> list[Assignment]:
        return sorted(self._of.get(member, {}).values(), key=lambda a: (a.journal, a.slot))

    def all_assignments(self) -> list[Assignment]:
        return [a for j in sorted(self._assign) for a in self.assignments(j)]

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> KeySpace:
        await self._load()
        self._task = asyncio.create_task(self._run(), name=f"keyspace-{self.root}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._catching_up is not None:
            self._catching_up.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # -- waiting ----------------------------------------------------------------------------

    async def wait_for_revision(self, revision: int, timeout: float) -> bool:
        """Wait until the mirror is complete through `revision`; False on timeout."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # races with completion, which left shutting-down members hanging.
        try:
            async with asyncio.timeout(timeout):
                while self.revision < revision:
                    # A write under our prefix arrives on the watch within milliseconds:
                    # give it that long before reading the prefix back (a read of every
                    # key, thousands with thousands of journals, for each waiter).
                    await self._watch_reaches(revision, CATCH_UP_AFTER)
                    if self.revision >= revision:
                        break
                    try:
                        await self._catch_up()
                    except aetcd.exceptions.ClientError:
                        pass  # etcd unreachable: the watch's events may still arrive
                    if self.revision >= revision:
                        break
                    # Events for our prefix are in flight; re-check after the next batch,
                    # or after a short while (the write may be outside our prefix).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.2):
                            await self._applied.wait()
        except TimeoutError:
            return False
        return True

    async def _watch_reaches(self, revision: int, within: float) -> None:
        """Return once the mirror is complete through `revision`, or after `within` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self.revision < revision:
            left = deadline - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._applied.wait()

    async def _catch_up(self) -> None:
        """`_read_to_catch_up`, shared by every caller while one is under way: a burst of
        waiters (every replicate stream of a route change) costs etcd one read of the
        whole prefix, not one each."""
        fut = self._catching_up
        if fut is None:
            fut = self._catching_up = asyncio.ensure_future(self._read_to_catch_up())

            def done(f: asyncio.Future[None]) -> None:
                if self._catching_up is f:
                    self._catching_up = None
                if not f.cancelled():
                    f.exception()  # (retrieved: every waiter may have gone)

            fut.add_done_callback(done)
        await asyncio.shield(fut)

    async def _read_to_catch_up(self) -> None:
        """Advance `revision` to etcd's current one if nothing under our prefix changed.

        The revision may belong to a write outside our prefix that no event announces.
        etcd 3.4's progress notifications can run ahead of a catching-up watcher's
        events, so instead we read the prefix's keys and mod revisions: if they match
        the mirror exactly, the mirror is complete through the read's revision.
        """
        resp = await self._client.get_prefix(self._prefix, keys_only=True)
        current = {kv.key: kv.mod_revision for kv in resp.kvs}
        if resp.header.revision > self.revision and current == self._mods:
            self.revision = resp.header.revision
            self._notify(changed=False)

    async def wait_changed(self, after_revision: int, timeout: float) -> bool:
        """Wait for a content change at a revision > `after_revision`; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while self.changed_revision <= after_revision:
                    await self._applied.wait()
        except TimeoutError:
            return False
        return True

    # -- loading and watching ---------------------------------------------------------------

    async def _load(self) -> None:
        resp = await self._client.get_prefix(self._prefix)
        journals: dict[str, JournalEntry] = {}
        members: dict[ProcessId, MemberEntry] = {}
        assign: dict[str, dict[tuple[ProcessId, int], Assignment]] = {}
        self.leader = None
        for kv in resp.kvs:
            self._put(kv, journals, members, assign)
        self._mods = {kv.key: kv.mod_revision for kv in resp.kvs}
        self.journals, self.members, self._assign = journals, members, assign
        self._sorted = {}
        self._of = {}
        for by in assign.values():
            for a in by.values():
                self._of.setdefault(a.member, {})[a.journal, a.slot] = a
        self._set_header(resp.header)
        self.revision = resp.header.revision
        self.touched = None
        self._notify(changed=True)
        log.debug("keyspace loaded", root=self.root, revision=self.revision,
                  journals=len(journals), members=len(members))

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            started = time.monotonic()
            try:
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure leads to a re-list
                log.warning("keyspace watch lost; re-listing", root=self.root,
                            revision=self.revision, error=repr(exc), backoff=backoff)
            # A watch that dies at once (etcd flapping) must not spin re-listing it.
            backoff = 0.05 if time.monotonic() - started > 5.0 else min(backoff * 2, MAX_BACKOFF)
            await asyncio.sleep(backoff)
            try:
                await self._load()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd still down: back off and retry
                log.warning("keyspace re-list failed", root=self.root, error=repr(exc))
                backoff = min(backoff * 2, MAX_BACKOFF)

    async def _watch(self) -> None:
        async with contextlib.aclosing(watch_events(self._client, self._prefix, self.revision + 1,
                                                    prefix=True)) as batches:
            async for resp in batches:
                self._apply_batch(resp)
        raise WatchEnded("watch stream closed")

    def _apply_batch(self, resp: Any) -> None:
        """Apply one watch response, idempotently by revision.

        The mirror is complete through `revision`, so an event at or below it is
        already reflected and is skipped: a watch resumed from an older revision (or a
        response delivered twice) never moves a key back to an older value, nor runs
        the callbacks for a change they have already seen."""
        through = self.revision
        changed = False
        touched: set[str] | None = set()
        for ev in resp.events:
            if ev.kv.mod_revision <= through:
                continue
            if ev.type == rpc.Event.PUT:
                self._mods[ev.kv.key] = ev.kv.mod_revision
            else:
                self._mods.pop(ev.kv.key, None)
            changed |= self._apply(ev)
            touched = self._touch(touched, ev.kv.key)
        self.touched = touched
        if resp.header.revision > through:
            self._set_header(resp.header)
            self.revision = resp.header.revision
        self._notify(changed)

    def _touch(self, touched: set[str] | None, raw_key: bytes) -> set[str] | None:
        """`touched` with the journal of a spec or assignment key; None for any other."""
        if touched is None:
            return None
        key = raw_key.decode(errors="replace")
        try:
            if key.startswith(journals_prefix(self.root)):
                touched.add(parse_journal_key(self.root, key))
                return touched
            if key.startswith(assign_prefix(self.root)):
                touched.add(parse_assignment_key(self.root, key)[0])
                return touched
        except (MalformedKey, ValueError):
            pass
        return None

    def _set_header(self, header: Any) -> None:
        self.etcd = Etcd(cluster_id=header.cluster_id, member_id=header.member_id,
                         revision=header.revision, raft_term=header.raft_term)

    def _notify(self, changed: bool) -> None:
        if changed:
            self.changed_revision = self.revision
            for callback in list(self.on_change):
                try:
                    callback(self)
                except Exception:  # noqa: BLE001 - a callback must not stop the mirror
                    log.exception("keyspace on_change callback failed", root=self.root)
        applied, self._applied = self._applied, asyncio.Event()
        applied.set()

    # -- decoding ---------------------------------------------------------------------------

    def _apply(self, ev: Any) -> bool:
        if ev.type == rpc.Event.PUT:
            return self._put(ev.kv, self.journals, self.members, self._assign)
        return self._delete(ev.kv.key.decode(errors="replace"))

    def _put(self, kv: Any, journals: dict[str, JournalEntry],
             members: dict[ProcessId, MemberEntry],
             assign: dict[str, dict[tuple[ProcessId, int], Assignment]]) -> bool:
        key = kv.key.decode(errors="replace")
        try:
            if key.startswith(journals_prefix(self.root)):
                name = parse_journal_key(self.root, key)
                spec = msgspec.json.decode(kv.value, type=JournalSpec)
                if spec.name != name:
                    raise MalformedKey(f"spec name {spec.name!r} differs from its key")
                journals[name] = JournalEntry(spec, kv.mod_revision, kv.create_revision)
            elif key.startswith(members_prefix(self.root)):
                pid = parse_member_key(self.root, key)
                bspec = msgspec.json.decode(kv.value, type=BrokerSpec)
                if bspec.id != pid:
                    raise MalformedKey(f"member id {bspec.id} differs from its key")
                members[pid] = MemberEntry(bspec, kv.mod_revision, kv.create_revision, kv.lease)
            elif key.startswith(assign_prefix(self.root)):
                journal, pid, slot = parse_assignment_key(self.root, key)
                route = msgspec.json.decode(kv.value, type=Route) if kv.value.strip() else None
                value = route if route is not None and route.members else None
                entry = Assignment(journal, pid, slot, value, kv.mod_revision,
                                   kv.create_revision, kv.lease)
                assign.setdefault(journal, {})[(pid, slot)] = entry
                if assign is self._assign:  # the live mirror (a re-list rebuilds the index)
                    self._sorted.pop(journal, None)
                    self._of.setdefault(pid, {})[journal, slot] = entry
            elif key == leader_key(self.root):
                self.leader = LeaderEntry(ProcessId.parse(kv.value.decode()), kv.mod_revision,
                                          kv.create_revision, kv.lease)
            else:
                return False
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, UnicodeDecodeError) as exc:
            log.warning("skipping malformed etcd value", key=key, error=str(exc))
            # A bad value replaces a good one: drop the stale entry rather than trust it.
            return self._delete(key)
        return True

    def _delete(self, key: str) -> bool:
        try:
            if key.startswith(journals_prefix(self.root)):
                return self.journals.pop(parse_journal_key(self.root, key), None) is not None
            if key.startswith(members_prefix(self.root)):
                return self.members.pop(parse_member_key(self.root, key), None) is not None
            if key.startswith(assign_prefix(self.root)):
                journal, pid, slot = parse_assignment_key(self.root, key)
                by = self._assign.get(journal, {})
                gone = by.pop((pid, slot), None) is not None
                if not by:
                    self._assign.pop(journal, None)
                self._sorted.pop(journal, None)
                mine = self._of.get(pid)
                if mine is not None:
                    mine.pop((journal, slot), None)
                    if not mine:
                        del self._of[pid]
                return gone
            if key == leader_key(self.root):
                self.leader = None
                return True
        except MalformedKey:
            return False
        return False
