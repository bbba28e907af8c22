"""The nemesis: plays a fault schedule against a running cluster.

Each `FaultEvent` is resolved to a concrete target when it fires (the primary of a
journal is looked up in the routes the cluster reports at that moment), applied,
held for its duration, and healed. Blocking process control (kill, start, waiting
for readiness) runs in a thread so the proxies, which live on this event loop, keep
forwarding meanwhile. Every fault becomes a `FaultRecord` in the history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from tools.services import Service, ServiceError
from topology.etcd import connect, members_prefix, range_op, txn

from .cluster import CoordinatorService, LocalCluster
from .history import FaultRecord, History
from .proxy import Fault, FaultMode, FaultProxy
from .local_faults import LocalFaults, delete_shard_lock
from .schedule import CONSUMER_KINDS, DISK_KINDS, FaultEvent, FaultKind

__all__ = ["ConsumerTargets", "Links", "Nemesis"]

log = structlog.get_logger("chaos.nemesis")

START_SLACK = 30.0
"""Seconds a service's start may take beyond its readiness bound (spawning, the last probe)."""

RouteLookup = Callable[[str], Awaitable[tuple[str | None, list[str]]]]
"""journal -> (primary process id "zone#suffix", other member ids)."""


class ConsumerTargets(Protocol):
    """The consumer group the consumer faults act on (chaos/consumer_group.py)."""

    @property
    def services(self) -> list[Service]: ...

    async def primary_of(self, shard: int) -> tuple[str, Service | None]:
        """(shard id, the member process holding its primary lock, if any)."""


@dataclass
class Links:
    """The proxies in front of coordinator i: clients use `client[i]`, peers `peer[i]`
    (empty when the coordinator cannot advertise a proxy endpoint)."""

    client: list[FaultProxy] = field(default_factory=list)
    peer: list[FaultProxy] = field(default_factory=list)

    def all(self) -> list[FaultProxy]:
        return [*self.client, *self.peer]


class Nemesis:
    def __init__(self, cluster: LocalCluster, links: Links, history: History,
                 journals: list[str], routes: RouteLookup,
                 consumers: ConsumerTargets | None = None) -> None:
        self.consumers = consumers
        self.cluster = cluster
        self.links = links
        self.history = history
        self.journals = journals
        self.routes = routes
        self.skipped: list[str] = []
        self.local: LocalFaults | None = None
        """Where the disk and clock kinds act (set by the runner when they are dealt)."""

    def _by_id(self, pid: str | None) -> CoordinatorService | None:
        for c in self.cluster.coordinators:
            if c.process_id == pid:
                return c
        return None

    async def run(self, events: list[FaultEvent], stop: asyncio.Event) -> None:
        for ev in events:
            wait = ev.at - self.history.now()
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    return
                except TimeoutError:
                    pass
            if stop.is_set():
                return
            try:
                await self.apply(ev)
            except Exception as exc:  # noqa: BLE001 - one failed fault must not end the run
                log.error("nemesis.fault_failed", kind=ev.kind.value, error=repr(exc))
                self.skipped.append(f"{ev.kind.value}@{ev.at}: {exc!r}")
                await self.heal_all()

    async def apply(self, ev: FaultEvent) -> None:
        kind = ev.kind
        if kind is FaultKind.DELETE_SHARD_LOCK:
            await delete_shard_lock(self, ev)
            return
        if kind in CONSUMER_KINDS:
            await self._consumer_fault(ev)
            return
        journal = self.journals[ev.journal % len(self.journals)]
        if kind in DISK_KINDS:
            if self.local is None:
                self.skipped.append(f"{kind.value}@{ev.at}: spools not on faulty disks")
                return
            await self.local.apply(self, ev, journal)
            return
        if kind in (FaultKind.KILL_PRIMARY, FaultKind.KILL_REPLICA, FaultKind.PAUSE_PRIMARY):
            primary, others = await self.routes(journal)
            pid = primary if kind is not FaultKind.KILL_REPLICA else (others[0] if others else None)
            target = self._by_id(pid)
            if target is None or not target.running:
                self.skipped.append(f"{kind.value}@{ev.at}: no target for {journal} ({pid})")
                log.warning("nemesis.no_target", kind=kind.value, journal=journal, pid=pid)
                return
            # The fault's time is when it took effect (the kill returned), so recovery
            # is not flattered by appends that were already in flight.
            if kind is FaultKind.PAUSE_PRIMARY:
                target.pause()
            else:
                await asyncio.to_thread(target.kill)
            rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target=pid or "",
                                                 journal=journal))
            await asyncio.sleep(ev.duration)
            if kind is FaultKind.PAUSE_PRIMARY:
                target.resume()
            else:
                await self._restart(target)
            self.history.healed(rec)
        elif kind in (FaultKind.DELETE_MEMBER_KEY, FaultKind.REVOKE_LEASE, FaultKind.ETCD_COMPACT):
            await self._etcd_fault(ev, journal)
        elif kind is FaultKind.PAUSE_ETCD:
            etcd = self.cluster.etcd
            assert etcd is not None
            etcd.pause()
            rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target="etcd"))
            await asyncio.sleep(ev.duration)
            etcd.resume()
            self.history.healed(rec)
        elif kind is FaultKind.ETCD_RESTART:
            etcd = self.cluster.etcd
            assert etcd is not None
            await asyncio.to_thread(etcd.kill)
            rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target="etcd"))
            await asyncio.sleep(ev.duration)
            await self._restart(etcd)
            self.history.healed(rec)
        elif kind is FaultKind.KILL_WORKER:
            worker = self.cluster.worker
            if worker is None:
                self.skipped.append(f"{kind.value}@{ev.at}: no worker")
                return
            await asyncio.to_thread(worker.kill)
            rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target="worker"))
            await asyncio.sleep(ev.duration)
            await self._restart(worker)
            self.history.healed(rec)
        else:
            proxies = self.links.peer if kind is FaultKind.NET_PEER else self.links.client
            note = ""
            if not proxies:
                # No --advertise: peer links cannot be proxied; fault the client link instead.
                proxies, note = self.links.client, "peer links not proxied; applied to client link"
            proxy = proxies[ev.coordinator % len(proxies)]
            p = ev.params
            fault = Fault(FaultMode(p["mode"]), delay=p.get("delay", 0.0), jitter=p.get("jitter", 0.0),
                          direction=p.get("direction", "down"), slice_max=p.get("slice_max", 7))
            rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target=proxy.name,
                                                 params=dict(p), note=note))
            proxy.set_fault(fault)
            await asyncio.sleep(ev.duration)
            proxy.heal()
            self.history.healed(rec)

    async def _consumer_fault(self, ev: FaultEvent) -> None:
        """kill -9 (then restart, same id and data) or SIGSTOP past its lease (then
        SIGCONT) the member that holds the primary lock of shard `ev.journal`."""
        kind = ev.kind
        if self.consumers is None:
            self.skipped.append(f"{kind.value}@{ev.at}: no consumer group")
            return
        shard, target = await self.consumers.primary_of(ev.journal)
        if target is None or not target.running or target.paused:
            self.skipped.append(f"{kind.value}@{ev.at}: no running primary for {shard}")
            log.warning("nemesis.no_target", kind=kind.value, shard=shard)
            return
        if kind is FaultKind.PAUSE_CONSUMER:
            target.pause()
        else:
            await asyncio.to_thread(target.kill)
        rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target=target.name,
                                             note=f"primary of {shard}"))
        await asyncio.sleep(ev.duration)
        if kind is FaultKind.PAUSE_CONSUMER:
            target.resume()
        else:
            await self._restart(target)
        self.history.healed(rec)

    async def _etcd_fault(self, ev: FaultEvent, journal: str) -> None:
        """One etcd call by hand, as an operator (or a restore) would: delete the
        primary's member key, revoke its lease, or compact to the current revision.
        Nothing to heal: the cluster must repair itself; the fault is held for its
        duration so the next one does not land on top of the reaction."""
        etcd = self.cluster.etcd
        assert etcd is not None and etcd.url
        kind, target, note = ev.kind, "etcd", ""
        client = await connect(etcd.url, timeout=5.0)
        try:
            if kind is FaultKind.ETCD_COMPACT:
                revision = (await txn(client, [], [range_op(members_prefix(self.cluster.root))])).revision
                await client.compact(revision)
                note = f"compacted to revision {revision}"
            else:
                pid, _ = await self.routes(journal)
                if pid is None:
                    self.skipped.append(f"{kind.value}@{ev.at}: no primary for {journal}")
                    return
                key = members_prefix(self.cluster.root) + pid
                kv = await client.get(key.encode())
                if kv is None:
                    self.skipped.append(f"{kind.value}@{ev.at}: no member key {key}")
                    return
                target = pid
                if kind is FaultKind.DELETE_MEMBER_KEY:
                    await client.delete(key.encode())
                else:
                    await client.revoke_lease(kv.lease)
                    note = f"lease {kv.lease:x}"
        finally:
            await client.close()
        rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target=target,
                                             journal=journal if target != "etcd" else "",
                                             note=note))
        await asyncio.sleep(ev.duration)
        self.history.healed(rec)

    async def _restart(self, svc: Service) -> None:
        """Start a killed service again (same port, same data), bounded: 3 tries, each
        given its readiness bound and START_SLACK more (a readiness probe that blocks
        inside one call is left behind on its daemon thread, chaos/bounded.py)."""
        if svc.running:
            return
        for attempt in range(3):
            bound = svc.ready_timeout + START_SLACK
            try:
                await asyncio.wait_for(asyncio.to_thread(svc.start), bound)
                return
            except TimeoutError:
                raise ServiceError(f"{svc.name}: start did not return within {bound:g} s "
                                   f"(its readiness probe blocked?)") from None
            except ServiceError as exc:
                log.warning("nemesis.restart_failed", service=svc.name, attempt=attempt,
                            error=str(exc)[:500])
                await asyncio.sleep(1.0)
        raise ServiceError(f"{svc.name} did not come back after 3 attempts")

    async def heal_all(self) -> None:
        """Everything back: proxies pass, paused processes resume, dead ones restart."""
        for proxy in self.links.all():
            if proxy.fault.mode is not FaultMode.PASS:
                proxy.heal()
        services: list[Service | None] = [self.cluster.etcd, *self.cluster.coordinators,
                                          self.cluster.worker]
        if self.consumers is not None:
            services += self.consumers.services
        await self._revive([svc for svc in services if svc is not None])

    async def _revive(self, services: list[Service]) -> None:
        """Paused services resumed, dead ones started again (a failure is logged: the
        run's liveness check then says what stayed down)."""
        for svc in services:
            if svc.paused:
                svc.resume()
            if not svc.running:
                try:
                    await self._restart(svc)
                except ServiceError as exc:
                    log.error("nemesis.heal_failed", service=svc.name, error=str(exc)[:500])
