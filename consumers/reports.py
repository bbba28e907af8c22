"""A consumer member's status reports: each running shard's status mirrored to etcd
(`_report_loop`, a primary's only beside its own lock), and a stopped run's report
withdrawn — with its lock, in one transaction — before a successor may take the shard
(`_after_exit`). Split from member.py (the shard lifecycle), whose ConsumerMember
inherits this; the state it uses (`running`, `membership`, `_report_lock`,
`_published`, `_withdrawing`, `_wake`, `_closing`) is the member's own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import msgspec

from protocol.logs import get_logger
from topology.etcd import cmp_create, delete_op, put_op, txn
from topology.shards import primary_key, status_key

from .runner import ShardRunner

__all__ = ["Running", "StatusReports", "WITHDRAW_RETRY"]

log = get_logger(__name__)

WITHDRAW_RETRY = 0.5
"""Seconds between attempts to withdraw a stopped shard's status report (see _after_exit)."""


@dataclass
class Running:
    """A shard this member runs: its runner and task, and whether (and under which lock
    revision) it runs as primary."""
    runner: ShardRunner
    stop: asyncio.Event
    task: asyncio.Task[None]
    primary: bool
    lock_revision: int = 0
    notice_rev: int | None = None


class StatusReports:
    """The reporting half of consumers.member.ConsumerMember (a mixin: no state of its own)."""

    async def _after_exit(self, shard: str, running: Running, keep_status: bool = False) -> None:
        """Withdraw our status report (`keep_status`: replace it with the run's final,
        FAILED one) and, if we held it, delete the lock, in one transaction, so no reader
        ever sees a released primary's PRIMARY report beside its successor's lock.

        Retried until it succeeds: a successor creates the lock only once no other
        member reports PRIMARY (`_acquire`), so a report left behind by an etcd error
        would hold the shard back. It stops retrying only when the report is gone by
        itself — our membership lost (its lease revoked or expired: etcd deletes the
        report with it) or a new lease announced — or, while the process exits, after
        one TTL (the exit revokes the lease)."""
        self._withdrawing.add(shard)
        lease = self.membership.lease_id
        started = time.monotonic()
        attempt = 0
        try:
            while True:
                async with self._report_lock:
                    key = status_key(self.root, shard, self.me)
                    if keep_status:
                        value = msgspec.json.encode(running.runner.status())
                        status = [put_op(key, value, lease)]
                    else:
                        status = [delete_op(key)]
                    try:
                        if running.primary and running.lock_revision:
                            lock = primary_key(self.root, shard)
                            await txn(self.etcd, [cmp_create(lock, running.lock_revision)],
                                      [delete_op(lock), *status], status)
                        else:
                            await txn(self.etcd, [], status)
                        self._published.pop(shard, None)
                        return
                    except Exception as exc:  # noqa: BLE001 - etcd unavailable: retried
                        error = repr(exc)
                if self.membership.lost.is_set() or self.membership.lease_id != lease:
                    log.warning("status report not withdrawn; gone with the lost lease",
                                shard=shard, error=error)
                    return
                if self._closing and time.monotonic() - started > self.ttl:
                    log.error("status report not withdrawn at exit; it goes with the lease",
                              shard=shard, error=error)
                    return
                attempt += 1
                if attempt == 1 or attempt % 20 == 0:
                    log.warning("withdrawing a status report failed; retrying", shard=shard,
                                primary=running.primary, attempt=attempt, error=error)
                await asyncio.sleep(WITHDRAW_RETRY)  # etcd unavailable: a bounded backoff
        finally:
            self._withdrawing.discard(shard)
            self._wake.set()

    async def _publish_one(self, runner: ShardRunner, lock_revision: int = 0) -> bool:
        """Write a shard's status report; a primary's (`lock_revision`) only while its lock
        is the one it took — never a PRIMARY report beside a successor's lock. False: the
        lock is gone (`_check_locks` stops the shard)."""
        value = msgspec.json.encode(runner.status())
        put = put_op(status_key(self.root, runner.spec.id, self.me), value, self.membership.lease_id)
        guard = [cmp_create(primary_key(self.root, runner.spec.id), lock_revision)] \
            if lock_revision else []
        return (await txn(self.etcd, guard, [put])).succeeded

    async def _report_loop(self) -> None:
        """Mirror each running shard's status (offsets, lag, state) to etcd every second."""
        while True:
            for shard, running in list(self.running.items()):
                status = running.runner.status()
                fingerprint = msgspec.json.encode(msgspec.structs.replace(status, updated=0.0))
                if self._published.get(shard) == fingerprint:
                    continue
                async with self._report_lock:
                    if self.running.get(shard) is not running or running.task.done():
                        continue  # stopped meanwhile: its report is (being) deleted
                    try:
                        lock_rev = running.lock_revision if running.primary else 0
                        if await self._publish_one(running.runner, lock_rev):
                            self._published[shard] = fingerprint
                    except Exception as exc:  # noqa: BLE001 - etcd hiccup: next round
                        log.warning("status report failed", shard=shard, error=repr(exc))
            await asyncio.sleep(1.0)
