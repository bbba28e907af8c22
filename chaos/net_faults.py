"""Faults at the network layer, on simulated hosts (`quire chaos --hosts N`).

The kernel makes them (tools/hosts): a host's switch port down, nftables drops between
groups of hosts, kill -9 of every process in a host's namespace. Targets are roles
resolved when the fault fires, like the other kinds:

    isolate-host                 the host of a journal's primary: its link down
    partition-primary-replicas   that host cut from its replicas' hosts, not from etcd
    partition-primary-etcd       that host cut from every etcd member's host, not from
                                 its replicas
    isolate-etcd-member          one etcd member's host: its link down
    cut-etcd-quorum              two of three etcd members' hosts: links down
    kill-host                    every process of the primary's host killed (-9), then
                                 started again on the same disk

`HostNemesis` plays these and hands every other kind to `chaos.nemesis.Nemesis`.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from typing import Any

import structlog

from tools.services import Service, ServiceError

from .history import FaultRecord, Op
from .nemesis import Nemesis
from .schedule import FaultEvent, FaultKind

__all__ = ["NET_LAYER_KINDS", "HostNemesis", "isolation_recovery"]

log = structlog.get_logger("chaos.net_faults")

NET_LAYER_KINDS = (FaultKind.ISOLATE_HOST, FaultKind.PARTITION_PRIMARY_REPLICAS,
                   FaultKind.PARTITION_PRIMARY_ETCD, FaultKind.ISOLATE_ETCD_MEMBER,
                   FaultKind.CUT_ETCD_QUORUM, FaultKind.KILL_HOST)

PRIMARY_HOST_KINDS = frozenset({"isolate-host", "kill-host"})
"""Faults that take a journal's primary away: recovery is fault -> first ok append."""


class HostNemesis(Nemesis):
    """The nemesis of a `chaos.host_cluster.HostCluster`."""

    async def apply(self, ev: FaultEvent) -> None:
        if ev.kind not in NET_LAYER_KINDS:
            await super().apply(ev)
            return
        cluster: Any = self.cluster
        h = cluster.harness
        journal = self.journals[ev.journal % len(self.journals)]
        kind, note = ev.kind, ""
        pid = ""
        if kind in (FaultKind.ISOLATE_ETCD_MEMBER, FaultKind.CUT_ETCD_QUORUM):
            n = len(cluster.etcd_hosts)
            first = ev.coordinator % n
            hosts = [cluster.etcd_hosts[(first + k) % n]
                     for k in range(1 if kind is FaultKind.ISOLATE_ETCD_MEMBER else n // 2 + 1)]
            for host in hosts:
                h.isolate(host)
            target, journal = ",".join(x.name for x in hosts), ""
        else:
            pid, others = await self.routes(journal)
            primary = self._by_id(pid)
            if primary is None:
                self.skipped.append(f"{kind.value}@{ev.at}: no primary for {journal} ({pid})")
                return
            host = cluster.host_of(primary)
            target = f"{host.name} ({pid})"
            if kind is FaultKind.ISOLATE_HOST:
                h.isolate(host)
            elif kind is FaultKind.KILL_HOST:
                await asyncio.to_thread(self._kill_host, host)
            elif kind is FaultKind.PARTITION_PRIMARY_REPLICAS:
                replicas = [cluster.host_of(c) for c in map(self._by_id, others) if c is not None]
                replicas = [r for r in replicas if r is not host]
                if not replicas:
                    self.skipped.append(f"{kind.value}@{ev.at}: no replica hosts for {journal}")
                    return
                h.partition([host], replicas)
                note = "from " + ",".join(r.name for r in replicas)
            else:
                etcd = [e for e in cluster.etcd_hosts if e is not host]
                h.partition([host], etcd)
                note = "from " + ",".join(e.name for e in etcd)
        rec = self.history.fault(FaultRecord(kind.value, self.history.now(), target=target,
                                             journal=journal, note=note))
        await asyncio.sleep(ev.duration)
        if kind is FaultKind.KILL_HOST:
            await self._restart_host(host)
        else:
            h.heal_all()
        self.history.healed(rec)

    def _kill_host(self, host: Any) -> None:
        host.kill_all()
        for svc in self._services_on(host):
            svc.kill()  # reaped and forgotten; started again by _restart_host

    def _services_on(self, host: Any) -> list[Service]:
        return [s for s in self._all_services() if getattr(s, "netns", None) == host.ns]

    async def _restart_host(self, host: Any) -> None:
        """The host's services back on the same disk (etcd first: a member rejoins)."""
        services = self._services_on(host)
        for svc in services:
            if not svc.running:
                svc.start(wait=False)
        for svc in services:
            try:
                await asyncio.to_thread(svc.wait_ready)
            except ServiceError as exc:
                log.warning("net_faults.restart_failed", service=svc.name, error=str(exc)[:300])
                await self._restart(svc)

    def _all_services(self) -> list[Service]:
        cluster: Any = self.cluster
        out: list[Service] = [*cluster.etcd.members, *cluster.coordinators]
        out += [s for s in (cluster.worker, cluster.redis, cluster.s3) if s is not None]
        if self.consumers is not None:
            out += list(self.consumers.services)
        return out

    async def heal_all(self) -> None:
        """Links up, partitions gone, paused processes resumed, dead ones started."""
        cluster: Any = self.cluster
        cluster.harness.heal_all()
        await self._revive(self._all_services())


def isolation_recovery(faults: Sequence[FaultRecord], ops: Sequence[Op]) -> dict[str, Any]:
    """Seconds from isolating (or killing) a primary's host to the completion of the first
    ok append on that journal invoked after it; p50/max and how many recovered. Pure."""
    ok: dict[str, list[Op]] = {}
    for op in ops:
        if op.outcome == "ok":
            ok.setdefault(op.journal, []).append(op)
    times: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for f in faults:
        if f.kind not in PRIMARY_HOST_KINDS or not f.journal:
            continue
        counts[f.kind] = counts.get(f.kind, 0) + 1
        after = [op.t_done for op in ok.get(f.journal, []) if op.t_invoke >= f.at]
        if after:
            times.setdefault(f.kind, []).append(round(min(after) - f.at, 3))
    return {kind: {"faults": n, "recovered": len(times.get(kind, [])),
                   "p50": round(statistics.median(times[kind]), 3) if times.get(kind) else None,
                   "max": max(times[kind]) if times.get(kind) else None,
                   "each": times.get(kind, [])}
            for kind, n in sorted(counts.items())}
