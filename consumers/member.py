"""A consumer member: announce, mirror shard keys, and run what plan.plan_member says.

The member holds a topology.Membership (its key under `<root>/consumers/members/`, a
kept-alive lease). Every shard lock it takes is written under that lease, so kill -9
releases its shards when the lease expires, and a paused (SIGSTOP) member that wakes
after its lease expired finds its locks gone and its recovery-log appends refused
(REGISTER_MISMATCH: fenced). On a lost membership it abandons every shard without
writing (`_fence`), and `Membership.maintain` re-announces it under a new lease (the
coordinators' behaviour); it takes no lock while not in good standing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aetcd
import msgspec

from protocol import ProcessId
from protocol.errors import StatusError
from protocol.logs import get_logger
from protocol.shard import ShardSpec, ShardState, ShardStatus
from quire.client import Client
from topology.allocator_plan import MemberState
from topology.etcd import cmp_version, delete_op, members_prefix, prefix_end, put_op, rpc, txn
from topology.membership import BrokerSpec, Membership
from topology.shards import (
    consumer_root,
    notice_prefix,
    primary_key,
    primary_prefix,
    shards_prefix,
    status_key,
    status_prefix,
)

from .app import App
from .mirror import Mirror
from .plan import Action, other_primaries, placement, plan_member
from .reports import Running as _Running
from .reports import StatusReports
from .runner import ShardRunner, cancel_all

__all__ = ["ConsumerMember"]

log = get_logger(__name__)

RETRY_AFTER_FAILURE = 2.0
STOP_TIMEOUT = 60.0


class ConsumerMember(StatusReports):
    def __init__(self, *, etcd: aetcd.Client, client: Client, root: str, me: ProcessId, app: App,
                 data_dir: str, ttl: float = 10.0, limit: int = 1024,
                 snapshot_interval: float = 10.0, selector_refresh: float = 10.0) -> None:
        self.etcd, self.client, self.root, self.me, self.app = etcd, client, root.rstrip("/"), me, app
        self.data_dir, self.ttl, self.limit = data_dir, ttl, limit
        self.snapshot_interval = snapshot_interval
        self.selector_refresh = selector_refresh
        self.running: dict[str, _Running] = {}
        self._failed: dict[str, float] = {}
        self._published: dict[str, bytes] = {}
        self.mirror = Mirror(etcd, [shards_prefix(root), consumer_root(root) + "/"])
        self._wake = asyncio.Event()
        self._report_lock = asyncio.Lock()
        self._blocked: dict[str, float] = {}
        """shard -> when another member's PRIMARY report first held its lock back (logs)."""
        self._withdrawing: set[str] = set()
        """Shards whose stopped run's status report is still being withdrawn."""
        self._closing = False

    # -- views of the mirror -------------------------------------------------------------

    def specs(self) -> dict[str, ShardSpec]:
        out = {}
        prefix = shards_prefix(self.root)
        for key, kv in self.mirror.items(prefix):
            try:
                spec = msgspec.json.decode(kv.value, type=ShardSpec)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if spec.id == key[len(prefix):]:
                out[spec.id] = spec
        return out

    def members(self) -> list[MemberState]:
        out = []
        for _key, kv in self.mirror.items(members_prefix(consumer_root(self.root))):
            try:
                b = msgspec.json.decode(kv.value, type=BrokerSpec)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            out.append(MemberState(b.id, b.journal_limit, b.exiting))
        return out

    def locks(self) -> dict[str, str]:
        prefix = primary_prefix(self.root)
        return {key[len(prefix):]: kv.value.decode() for key, kv in self.mirror.items(prefix)}

    # -- main loop -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> int:
        spec = BrokerSpec(id=self.me, journal_limit=self.limit)
        async with Membership(self.etcd, consumer_root(self.root), spec, ttl=self.ttl,
                              wait_absent=self.ttl + 2) as membership:
            self.membership = membership
            async with self.mirror:
                self.mirror.on_change.append(lambda: self._wake.set())
                reporter = asyncio.create_task(self._report_loop(), name="status-reporter")
                if ready is not None:
                    ready.set()
                maintainer = asyncio.create_task(membership.maintain(self._fence),
                                                 name="membership")
                try:
                    while not stop.is_set():
                        self._reap()
                        if membership.in_good_standing:  # never take a lock in doubt
                            try:
                                await self._step()
                            except StatusError as exc:  # etcd hiccup, a lease just lost
                                log.warning("member step failed; retrying", error=str(exc))
                        self._wake.clear()
                        waits = [asyncio.ensure_future(e.wait()) for e in (self._wake, stop)]
                        await asyncio.wait(waits, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                        for w in waits:
                            w.cancel()
                    self._closing = True
                    maintainer.cancel()
                    await cancel_all([maintainer])
                    if membership.in_good_standing:
                        await membership.set_exiting()
                    await self._release_all()
                finally:
                    reporter.cancel()
                    with contextlib.suppress(BaseException):
                        await reporter
        return 0

    async def _check_locks(self) -> None:
        """Stop every primary whose lock this member no longer holds (deleted by hand,
        re-created by another member): its own watch (the mirror) says so, as a
        coordinator's says its member key is gone. The shard stops writing at once —
        cancelled, nothing committed (the recovery-log fence would refuse it anyway) —
        its status report is withdrawn, and the plan then acquires the lock again or
        leaves it to the allocator's choice, within the lease TTL + 2 s."""
        for shard, running in list(self.running.items()):
            if not running.primary or not running.lock_revision:
                continue
            key = primary_key(self.root, shard)
            kv = self.mirror.kvs.get(key)
            if kv is not None and kv.create_revision == running.lock_revision:
                continue
            if kv is None and self.mirror.seen(key) < running.lock_revision:
                continue  # our own acquisition has not reached the mirror yet
            log.error("shard lock lost: stopping the shard's writes", shard=shard,
                      member=str(self.me), lock_revision=running.lock_revision,
                      holder=kv.value.decode() if kv is not None else None)
            running.task.cancel()
            await asyncio.gather(running.task, return_exceptions=True)
            self.running.pop(shard, None)
            await self._after_exit(shard, running)  # (the lock's compare fails: status only)

    async def _step(self) -> None:
        await self._check_locks()
        specs = self.specs()
        ranked = placement(specs.values(), self.members())
        locks = self.locks()
        primaries = [s for s, r in self.running.items() if r.primary]
        standbys = [s for s, r in self.running.items() if not r.primary]
        for shard, until in list(self._failed.items()):
            if time.monotonic() >= until:
                del self._failed[shard]
                if shard not in self.running:  # not retried here: withdraw the FAILED report
                    with contextlib.suppress(Exception):
                        await txn(self.etcd, [], [delete_op(status_key(self.root, shard, self.me))])
        for step in plan_member(self.me, specs, ranked, locks, primaries, standbys):
            if step.shard in self._failed and time.monotonic() < self._failed[step.shard]:
                continue
            if step.action is Action.RELEASE or step.action is Action.STOP_STANDBY:
                await self._stop(step.shard)
            elif step.action is Action.ACQUIRE:
                await self._acquire(specs[step.shard])
            elif step.action is Action.STANDBY:
                self._start(specs[step.shard], primary=False)
        notices = {key[len(notice_prefix(self.root)):]: kv.mod_revision
                   for key, kv in self.mirror.items(notice_prefix(self.root))}
        for shard, running in self.running.items():
            rev = notices.get(shard, 0)
            if running.notice_rev is not None and rev > running.notice_rev:
                running.runner.notice.set()
            running.notice_rev = rev

    def _reap(self) -> None:
        for shard, running in list(self.running.items()):
            if not running.task.done():
                continue
            del self.running[shard]
            exc = None if running.task.cancelled() else running.task.exception()
            if exc is not None:
                log.error("shard failed", shard=shard, error=repr(exc), primary=running.primary)
                self._failed[shard] = time.monotonic() + RETRY_AFTER_FAILURE
            # A FAILED report stays visible (`quire shards list`) until the retry.
            asyncio.ensure_future(self._after_exit(shard, running, keep_status=exc is not None))

    def _primary_elsewhere(self, shard: str) -> list[str]:
        """Other members whose report still says PRIMARY for `shard`: a holder whose lock
        was deleted, not yet noticed (e.g. its etcd lost quorum meanwhile), or one whose
        withdrawal is being retried (`_after_exit`). Its report lives on its lease — a
        dead member's goes when the lease expires — so the lock waits for it, with no
        timeout (plan.other_primaries)."""
        reports = []
        for _key, kv in self.mirror.items(f"{status_prefix(self.root)}{shard}#"):
            try:
                reports.append(msgspec.json.decode(kv.value, type=ShardStatus))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        return other_primaries(self.me, shard, reports)

    async def _acquire(self, spec: ShardSpec) -> None:
        if spec.id in self._withdrawing:
            return  # our previous run's report is still being withdrawn (it wakes us)
        others = self._primary_elsewhere(spec.id)
        if others:  # (the mirror wakes us when that report goes)
            now = time.monotonic()
            since = self._blocked.setdefault(spec.id, now)
            if now - since >= self.ttl:
                log.warning("shard lock held back by another member's PRIMARY report",
                            shard=spec.id, reporters=others, waited=round(now - since, 1))
                self._blocked[spec.id] = now  # (logged once a TTL)
            return
        self._blocked.pop(spec.id, None)
        key = primary_key(self.root, spec.id)
        reports = f"{status_prefix(self.root)}{spec.id}#".encode()
        # The view above is the mirror's through `seen`: the lock is created only if no
        # report of the shard was written since (one that turned PRIMARY meanwhile).
        seen = self.mirror.seen(key)
        unchanged = rpc.Compare(key=reports, range_end=prefix_end(reports),
                                target=rpc.Compare.MOD, result=rpc.Compare.LESS,
                                mod_revision=seen + 1)
        async with self._report_lock:  # our own report does not move under the compare
            result = await txn(self.etcd, [cmp_version(key, 0), unchanged],
                               [put_op(key, str(self.me).encode(), self.membership.lease_id)])
        if not result.succeeded:
            return
        if spec.id in self.running:  # a standby being promoted: it must close the store
            await self._stop(spec.id, keep_lock=True)
        self._start(spec, primary=True, lock_revision=result.revision)

    def _start(self, spec: ShardSpec, *, primary: bool, lock_revision: int = 0) -> None:
        runner = ShardRunner(client=self.client, etcd=self.etcd, root=self.root, me=self.me,
                             spec=spec, app=self.app, data_dir=self.data_dir,
                             snapshot_interval=self.snapshot_interval,
                             selector_refresh=self.selector_refresh)
        stop = asyncio.Event()
        if primary:
            author = f"{self.me.zone}.{self.me.suffix}.{lock_revision}"
            coro = runner.run_primary(author, stop)
        else:
            coro = runner.run_standby(stop)
        task = asyncio.create_task(self._guarded(runner, coro), name=f"shard-{spec.id}")
        self.running[spec.id] = _Running(runner, stop, task, primary, lock_revision)
        log.info("shard started", shard=spec.id, role="primary" if primary else "standby")

    async def _guarded(self, runner: ShardRunner, coro) -> None:  # type: ignore[no-untyped-def]
        try:
            await coro
            with contextlib.suppress(ValueError):
                runner.lifecycle.to(ShardState.IDLE)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            runner.lifecycle.to(ShardState.FAILED, f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):
                await self._publish_one(runner)
            raise
        finally:
            self._wake.set()

    async def _stop(self, shard: str, keep_lock: bool = False) -> None:
        running = self.running.get(shard)
        if running is None:
            return
        if self.membership.lost.is_set():
            running.task.cancel()  # not a member any more: write nothing, just stop
        running.stop.set()
        error = ""
        try:
            # A release commits what is open (one log append): bounded, then cancelled.
            await asyncio.wait({running.task}, timeout=STOP_TIMEOUT)
            if not running.task.done():
                await cancel_all([running.task])
            await running.task
        except asyncio.CancelledError:
            error = "cancelled"
        except Exception as exc:  # noqa: BLE001 - e.g. ShardFenced: reported, then released
            error = f"{type(exc).__name__}: {exc}"
        self.running.pop(shard, None)
        if not keep_lock:
            await self._after_exit(shard, running)
        log.info("shard stopped", shard=shard, primary=running.primary, error=error or None)

    async def _release_all(self) -> None:
        await asyncio.gather(*(self._stop(s) for s in list(self.running)), return_exceptions=True)

    async def _fence(self, reason: str) -> None:
        """Membership lost (lease expired or revoked, key deleted): everything held under
        the old lease is gone from etcd, and a successor may already have fenced our
        recovery logs. Drop every shard without writing; Membership then re-announces."""
        log.error("membership lost; abandoning every shard", member=str(self.me), reason=reason,
                  shards=sorted(self.running))
        await self._abandon()
        self._published.clear()
        self._failed.clear()
        self._wake.set()

    async def _abandon(self) -> None:
        for running in self.running.values():
            running.task.cancel()
        await asyncio.gather(*(r.task for r in self.running.values()), return_exceptions=True)
        self.running.clear()
