"""A member's announcement: `<root>/members/<zone>#<suffix>` bound to its lease.

Gazette's announce.go: the key is created only if absent, so two processes with the same
ProcessId can never both believe they are that member; the lease is kept alive by a task
this object owns, and revoking it on exit deletes the member key and every assignment
written under it in one step, which is what makes a crashed member's journals move.
"""

from __future__ import annotations

import asyncio
import math
import time
from types import TracebackType

import aetcd
import msgspec
import structlog

from protocol import ProcessId

from .etcd import DuplicateMember, EtcdError, TopologyError, cmp_version, member_key, put_op, txn

__all__ = ["BrokerSpec", "Membership"]

log = structlog.get_logger()


class BrokerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a member announces (the value of its member key)."""

    id: ProcessId
    endpoint: str = ""
    """`host:port` where peers and clients reach it."""
    journal_limit: int = 1024
    """The most journal assignments (of any slot) it accepts."""
    exiting: bool = False
    """Set on graceful shutdown: the allocator moves its journals away."""


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
        self._wait_absent = wait_absent
        self._lease_id = 0
        self._task: asyncio.Task[None] | None = None
        self.lost = asyncio.Event()
        """Set when etcd reports the lease gone: this process is no longer a member."""

    @property
    def lease_id(self) -> int:
        return self._lease_id

    @property
    def spec(self) -> BrokerSpec:
        return self._spec

    @property
    def key(self) -> str:
        return member_key(self._root, self._spec.id)

    async def __aenter__(self) -> Membership:
        lease = await self._client.lease(self._ttl)
        self._lease_id = lease.id
        # Keep the new lease alive from the start: `_create` may wait up to
        # `wait_absent` (longer than our own TTL) for a previous incarnation's key to
        # expire, and a lease nobody refreshes would expire first ("requested lease
        # not found" on the put).
        self._task = asyncio.create_task(self._keep_alive(), name=f"lease-{self._spec.id}")
        try:
            await self._create()
        except BaseException:
            await self._stop_keep_alive()
            await self._revoke()
            raise
        log.info("member announced", member=str(self._spec.id), lease=self._lease_id,
                 ttl=self._ttl, endpoint=self._spec.endpoint)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stop_keep_alive()
        if self._lease_id:
            await self._revoke()
            log.info("member left", member=str(self._spec.id))

    async def _stop_keep_alive(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _create(self) -> None:
        deadline = time.monotonic() + self._wait_absent
        value = msgspec.json.encode(self._spec)
        delay = 0.1
        while True:
            result = await txn(self._client, [cmp_version(self.key, 0)],
                               [put_op(self.key, value, self._lease_id)])
            if result.succeeded:
                return
            if time.monotonic() >= deadline:
                raise DuplicateMember(f"member {self._spec.id} is already registered at {self.key}")
            # The previous holder's lease has not expired yet; its TTL bounds this wait.
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    async def renew(self) -> None:
        """Announce again under a new lease after the old one expired (`lost`): e.g. the
        process was paused past its TTL. etcd already deleted the old member key and every
        assignment and leader key under that lease, so this is a new incarnation of the
        same member; the caller has already dropped everything the old one held (hosting)."""
        await self._stop_keep_alive()
        self._lease_id = 0
        lease = await self._client.lease(self._ttl)
        self._lease_id = lease.id
        self.lost = asyncio.Event()
        self._task = asyncio.create_task(self._keep_alive(), name=f"lease-{self._spec.id}")
        await self._create()
        log.warning("member re-announced under a new lease", member=str(self._spec.id),
                    lease=self._lease_id)

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

    async def _keep_alive(self) -> None:
        # Refresh at a third of the TTL so two lost refreshes still leave time for a third.
        interval = self._ttl / 3.0
        while True:
            try:
                async with asyncio.timeout(interval):
                    reply = await self._client.refresh_lease(self._lease_id)
                if reply is not None and reply.TTL <= 0:
                    log.error("member lease expired", member=str(self._spec.id),
                              lease=self._lease_id)
                    self.lost.set()
                    return
            except (TimeoutError, aetcd.exceptions.ClientError, EtcdError) as exc:
                # etcd down or restarting: keep trying; etcd renews leases on recovery.
                log.warning("lease refresh failed", member=str(self._spec.id), error=repr(exc))
            except Exception as exc:  # noqa: BLE001 - grpc errors surface as several types
                log.warning("lease refresh failed", member=str(self._spec.id), error=repr(exc))
            await asyncio.sleep(interval)

    async def _revoke(self) -> None:
        if not self._lease_id:
            return
        try:
            async with asyncio.timeout(5.0):
                await self._client.revoke_lease(self._lease_id)
        except Exception as exc:  # noqa: BLE001 - best effort: expiry removes it anyway
            log.warning("lease revoke failed", member=str(self._spec.id), error=repr(exc))
        self._lease_id = 0
