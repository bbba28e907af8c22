"""A member's announcement: `<root>/members/<zone>#<suffix>` bound to its lease.

Gazette's announce.go: the key is created only if absent, so two processes with the same
ProcessId can never both believe they are that member; the lease is kept alive by a task
this object owns, and revoking it on exit deletes the member key and every assignment
written under it in one step, which is what makes a crashed member's journals move.

Watching our own membership (any member kind: coordinators, consumers). A member is
*lost* as soon as etcd says so, from either of two tasks:

- the own-key watch sees the member key deleted (`etcdctl del`, a revoked lease, a
  restore from a backup) or re-written under another lease. It survives compaction and
  etcd restarts: when the stream ends it re-reads the key and watches again from the
  read's revision, so a deletion in a compacted gap is still seen.
- the lease refresh finds the lease expired (TTL <= 0).

`maintain(fence)` reacts: `fence(reason)` drops everything the old incarnation held
(the caller's part: pipelines, streams, shard work), then the old lease is revoked (etcd
deletes every key still under it: assignments, leader key) and the member announces
itself again under a fresh lease. See docs/reliability.md for why we re-announce in
place rather than exit.

*Standing.* A refresh sent at local time t that etcd answers with TTL T proves the lease
lives until at least t + T (etcd restarts its countdown when it receives the refresh,
after t). `in_good_standing` is true while that bound minus a margin lies ahead, so a
member cut off from etcd (etcd paused or partitioned away) stops acting on its lease —
e.g. as a journal's primary — before etcd could expire it and hand its work to others.
`on_standing` callbacks hear each change (False: stop leading; True: confirmed again).

*Current view.* Standing says our lease lives; it does not say our mirror of the keyspace
is up to date. A member back from an isolation longer than its TTL re-announces (or, back
from a shorter one, is confirmed again) while its watch may still be replaying what
happened meanwhile — a new primary, appends it took. `standing_revision` is etcd's
revision when our standing was last established (the announce, or the refresh that ended
a doubt): a view older than it may predate that, and a member acts on its view (leads a
journal, tells a reader the write head) only once its keyspace has reached it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from types import TracebackType

import aetcd
import msgspec
import structlog
from aetcd import rpc

from protocol import ProcessId

from .etcd import (
    DuplicateMember,
    EtcdError,
    TopologyError,
    cmp_version,
    member_key,
    put_op,
    range_op,
    txn,
)
from .watch import watch_events

__all__ = ["BrokerSpec", "Membership", "doubt_margin", "own_key_verdict"]

log = structlog.get_logger()

STARTUP_WAIT = 60.0
"""Seconds a starting member waits for an unreachable etcd before giving up."""


class BrokerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a member announces (the value of its member key)."""

    id: ProcessId
    endpoint: str = ""
    """`host:port` where peers and clients reach it."""
    journal_limit: int = 1024
    """The most journal assignments (of any slot) it accepts."""
    exiting: bool = False
    """Set on graceful shutdown: the allocator moves its journals away."""
    health: str = ""
    """Empty while healthy; else why the member refuses writes, e.g. "full: spool
    filesystem full: ..." or "failed: spool write failed: ..." (coordinator/spool_health.py)."""


def own_key_verdict(present: bool, key_lease: int, our_lease: int) -> str | None:
    """Why the member key no longer announces us (None: it does). Pure."""
    if not present:
        return "member key deleted"
    if key_lease != our_lease:
        return f"member key re-written under lease {key_lease:x}, not ours ({our_lease:x})"
    return None


def doubt_margin(ttl: float) -> float:
    """How long before the proven end of our lease we stop acting on it: a fifth of the
    TTL, at most 1 s (covers clock-rate drift and etcd's expiry-check granularity)."""
    return min(1.0, ttl / 5.0)


class Membership:
    """Async context manager holding a member key under a kept-alive lease.

    `wait_absent` > 0 retries creation for that long while a previous incarnation's key
    still exists (e.g. after kill -9, until its lease expires); 0 fails at once.
    """

    def __init__(self, client: aetcd.Client, root: str, spec: BrokerSpec, ttl: float = 20.0,
                 *, wait_absent: float = 0.0) -> None:
        spec.id.validate("id")
        if spec.journal_limit < 0:
            raise TopologyError(f"journal_limit {spec.journal_limit} must be >= 0")
        self._client = client
        self._root = root
        self._spec = spec
        # etcd grants whole seconds; round up so we never get less than asked for.
        self._ttl = max(1, math.ceil(ttl))
        self._margin = doubt_margin(self._ttl)
        self._wait_absent = wait_absent
        self._lease_id = 0
        self._tasks: list[asyncio.Task[None]] = []
        self.lost = asyncio.Event()
        """Set when etcd says we are no longer a member (key gone, lease expired)."""
        self.lost_reason = ""
        self.valid_until = 0.0
        """Monotonic time until which etcd cannot have expired our lease."""
        self.on_standing: list[Callable[[bool], None]] = []
        self.standing_revision = 0
        """etcd's revision when our standing was last established (module doc)."""
        """Sync callbacks, called with False when the lease can no longer be vouched for
        (unconfirmed for TTL - margin, or lost) and True when it is confirmed again."""
        self._in_doubt = False
        self._confirmed = asyncio.Event()

    @property
    def lease_id(self) -> int:
        return self._lease_id

    @property
    def spec(self) -> BrokerSpec:
        return self._spec

    @property
    def key(self) -> str:
        return member_key(self._root, self._spec.id)

    @property
    def ttl(self) -> int:
        return self._ttl

    @property
    def in_good_standing(self) -> bool:
        """True while our lease certainly lives and our key announces us."""
        return not self.lost.is_set() and time.monotonic() < self.valid_until - self._margin

    async def __aenter__(self) -> Membership:
        # etcd may be restarting as we start (a supervisor restarting us after a crash
        # often races an etcd restart): wait for it, bounded, instead of exiting at once.
        deadline = time.monotonic() + STARTUP_WAIT
        delay = 0.2
        while True:
            try:
                await self._announce()
                break
            except (aetcd.exceptions.ConnectionFailedError,
                    aetcd.exceptions.ConnectionTimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("etcd unreachable; announcing again", member=str(self._spec.id),
                            error=str(exc)[:200], delay=delay)
                await asyncio.sleep(delay)  # backoff against an unavailable etcd
                delay = min(delay * 2, 5.0)
        log.info("member announced", member=str(self._spec.id), lease=self._lease_id,
                 ttl=self._ttl, endpoint=self._spec.endpoint)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stop_tasks()
        if self._lease_id:
            await self._revoke()
            log.info("member left", member=str(self._spec.id))

    async def _announce(self) -> None:
        """Grant a lease, keep it alive, create the key, then watch it and our standing."""
        sent = time.monotonic()
        lease = await self._client.lease(self._ttl)
        self._lease_id = lease.id
        self.valid_until = sent + lease.ttl
        # Keep the new lease alive from the start: `_create` may wait up to
        # `wait_absent` (longer than our own TTL) for a previous incarnation's key to
        # expire, and a lease nobody refreshes would expire first ("requested lease
        # not found" on the put).
        self._start(self._keep_alive(self._lease_id), "lease")
        try:
            revision = await self._create()
        except BaseException:
            await self._stop_tasks()
            await self._revoke()
            raise
        self.standing_revision = revision
        self._start(self._watch_own_key(self._lease_id, revision), "own-key")
        self._start(self._watch_standing(), "standing")

    def _start(self, coro: Awaitable[None], what: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"member-{what}-{self._spec.id}"))  # type: ignore[arg-type]

    async def _stop_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _create(self) -> int:
        """Create our key (absent only); the revision it was created at."""
        deadline = time.monotonic() + self._wait_absent
        value = msgspec.json.encode(self._spec)
        delay = 0.1
        while True:
            result = await txn(self._client, [cmp_version(self.key, 0)],
                               [put_op(self.key, value, self._lease_id)])
            if result.succeeded:
                return result.revision
            if time.monotonic() >= deadline:
                raise DuplicateMember(f"member {self._spec.id} is already registered at {self.key}")
            # The previous holder's lease has not expired yet; its TTL bounds this wait.
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    # -- losing and regaining membership ---------------------------------------------------

    def _lose(self, lease_id: int, reason: str) -> None:
        if lease_id != self._lease_id or self.lost.is_set():
            return  # an older incarnation's task, or already known
        self.lost_reason = reason
        log.error("membership lost", member=str(self._spec.id), lease=lease_id, reason=reason)
        self.lost.set()
        self._set_doubt(True)

    def _set_doubt(self, doubt: bool) -> None:
        if doubt == self._in_doubt:
            return
        self._in_doubt = doubt
        for callback in list(self.on_standing):
            try:
                callback(not doubt)
            except Exception:  # a callback must not stop the watch
                log.exception("on_standing callback failed", member=str(self._spec.id))

    async def maintain(self, fence: Callable[[str], Awaitable[None]]) -> None:
        """Run until cancelled: whenever membership is lost, `await fence(reason)` (drop
        everything held under the old lease), then re-announce (`renew`), retrying with
        backoff while etcd is unreachable."""
        while True:
            await self.lost.wait()
            await fence(self.lost_reason)
            delay = 0.2
            while True:
                try:
                    await self.renew()
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - etcd unreachable: keep trying
                    log.warning("re-announcing failed; retrying", member=str(self._spec.id),
                                error=repr(exc), delay=delay)
                    await asyncio.sleep(delay)  # backoff against an unavailable etcd
                    delay = min(delay * 2, 5.0)

    async def renew(self) -> None:
        """Announce again under a new lease after membership was lost. The old lease is
        revoked first (a fence: etcd deletes every key still under it — assignments, the
        allocator's leader key — if the key alone was deleted and the lease lives on), so
        nothing of the old incarnation survives beside the new one. The caller has
        already dropped what the old one held (`maintain`'s fence)."""
        await self._stop_tasks()
        if self._lease_id:
            await self._revoke(strict=True)
        await self._announce()
        self.lost_reason = ""
        self.lost.clear()
        self._set_doubt(not self.in_good_standing)
        log.warning("member re-announced under a new lease", member=str(self._spec.id),
                    lease=self._lease_id)

    async def set_health(self, health: str, exiting: bool = False) -> None:
        """Announce the member's health (and, for a failed spool, that it is exiting, so
        the allocator moves its journals to healthy members)."""
        spec = msgspec.structs.replace(self._spec, health=health,
                                       exiting=self._spec.exiting or exiting)
        if spec == self._spec:
            return
        self._spec = spec
        result = await txn(self._client, [cmp_version(self.key, 0)], [],
                           [put_op(self.key, msgspec.json.encode(self._spec), self._lease_id)])
        if result.succeeded:
            raise TopologyError(f"member key {self.key} is gone; cannot announce its health")
        log.warning("member health announced", member=str(self._spec.id), health=health,
                    exiting=spec.exiting)

    async def resign(self, health: str) -> None:
        """Give up every assignment at once and stay listed as unable to host: the old
        lease is revoked (etcd deletes our assignments with it, so the allocator treats
        them as a crashed member's: the survivors' sync decides, as after kill -9) and
        we announce again, exiting, with a journal limit of 0 and `health` saying why.
        For a member whose spool failed (coordinator/spool_health.py): it cannot sync a
        route away gracefully, since its own writes fail."""
        self._spec = msgspec.structs.replace(self._spec, health=health, exiting=True,
                                             journal_limit=0)
        await self.renew()
        log.error("member resigned every assignment", member=str(self._spec.id), health=health)

    async def set_exiting(self) -> None:
        """Announce a graceful exit: the allocator stops placing here and drains us."""
        if self._spec.exiting:
            return
        self._spec = msgspec.structs.replace(self._spec, exiting=True)
        # Guarded on the key still existing: re-creating it after a lost lease would
        # resurrect a member whose assignments are already gone.
        result = await txn(self._client, [cmp_version(self.key, 0)], [],
                           [put_op(self.key, msgspec.json.encode(self._spec), self._lease_id)])
        if result.succeeded:
            raise TopologyError(f"member key {self.key} is gone; cannot mark it exiting")
        log.info("member exiting", member=str(self._spec.id))

    # -- the tasks -------------------------------------------------------------------------

    async def _keep_alive(self, lease_id: int) -> None:
        # Refresh at a third of the TTL so two lost refreshes still leave time for a third.
        interval = self._ttl / 3.0
        while True:
            sent = time.monotonic()
            try:
                async with asyncio.timeout(interval):
                    reply = await self._client.refresh_lease(lease_id)
                if reply is not None and reply.TTL <= 0:
                    self._lose(lease_id, "lease expired")
                    return
                if reply is not None:
                    self.valid_until = max(self.valid_until, sent + reply.TTL)
                    if self._in_doubt and not self.lost.is_set():
                        self.standing_revision = max(self.standing_revision,
                                                     reply.header.revision)
                        log.warning("member lease confirmed again", member=str(self._spec.id),
                                    revision=self.standing_revision)
                        self._set_doubt(False)
                    confirmed, self._confirmed = self._confirmed, asyncio.Event()
                    confirmed.set()
            except (TimeoutError, aetcd.exceptions.ClientError, EtcdError) as exc:
                # etcd down or restarting: keep trying; etcd renews leases on recovery.
                log.warning("lease refresh failed", member=str(self._spec.id), error=repr(exc))
            except Exception as exc:  # noqa: BLE001 - grpc errors surface as several types
                log.warning("lease refresh failed", member=str(self._spec.id), error=repr(exc))
            await asyncio.sleep(max(0.0, sent + interval - time.monotonic()))

    async def _watch_standing(self) -> None:
        """Enter doubt when the lease's proven life (minus the margin) runs out."""
        while True:
            remaining = self.valid_until - self._margin - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(remaining)
                continue
            if not self._in_doubt:
                log.error("member lease unconfirmed for its TTL; no longer acting on it",
                          member=str(self._spec.id), lease=self._lease_id, ttl=self._ttl)
                self._set_doubt(True)
            await self._confirmed.wait()

    async def _watch_own_key(self, lease_id: int, revision: int) -> None:
        """Lose membership as soon as our key is deleted or taken over (module doc)."""
        key = self.key.encode()
        delay = 0.05
        while True:
            started = time.monotonic()
            try:
                async with contextlib.aclosing(watch_events(self._client, key, revision + 1)) as batches:
                    async for resp in batches:
                        for ev in resp.events:
                            deleted = ev.type == rpc.Event.DELETE
                            verdict = own_key_verdict(not deleted, ev.kv.lease, lease_id)
                            if verdict:
                                return self._lose(lease_id, verdict)
                        revision = max(revision, resp.header.revision)
                        delay = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - compacted, cancelled, etcd down: re-read
                log.info("own member key watch ended; re-reading the key",
                         member=str(self._spec.id), error=repr(exc))
            try:
                result = await txn(self._client, [], [range_op(key)])
                kvs = result.responses[0].response_range.kvs
                verdict = own_key_verdict(bool(kvs), kvs[0].lease if kvs else 0, lease_id)
                if verdict:
                    return self._lose(lease_id, verdict)
                revision = result.revision  # watch again from the read's revision
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd unreachable: back off and retry
                log.warning("own member key re-read failed", member=str(self._spec.id),
                            error=repr(exc), delay=delay)
            if time.monotonic() - started > 5.0:
                delay = 0.05  # the watch ran a while: this is not a flapping etcd
            await asyncio.sleep(delay)  # backoff against an unavailable or flapping etcd
            delay = min(delay * 2, 2.0)

    async def _revoke(self, *, strict: bool = False) -> None:
        """Revoke our lease (an already expired one counts as revoked). Best effort unless
        `strict`, which raises while etcd cannot confirm it, keeping the lease id."""
        if not self._lease_id:
            return
        try:
            async with asyncio.timeout(5.0):
                await self._client.revoke_lease(self._lease_id)
        except Exception as exc:  # best effort: expiry removes it anyway
            if "not found" not in str(exc).lower():
                log.warning("lease revoke failed", member=str(self._spec.id), error=repr(exc))
                if strict:
                    raise
        self._lease_id = 0
