"""Faults of one coordinator's disk and clock, and of a consumer shard's lock.

The nemesis (nemesis.py) hands these kinds here (schedule.py: DISK_KINDS and
DELETE_SHARD_LOCK). For the disk kinds every coordinator's spool sits on errfs over a
small tmpfs of its own (tools/services/disk_faults.py), mounted before the cluster
starts (`LocalFaults.prepare`) and unmounted when the run ends (`close`):

* disk-full — a ballast file takes all but a few KiB of the target's spool filesystem
  for the fault's duration, then is removed: appends are refused with SPOOL_FULL and
  resume by themselves (coordinator/spool_health.py);
* disk-error — the target's spool fails with EIO (even journal index) or EROFS (odd):
  the member fails definitely and resigns its journals; healed by a good disk and a
  restart (kill -9, same id and spool directory), as an operator would;
* clock-skew — the target is restarted (SIGTERM: a graceful drain) with its wall clock
  minutes off under faketime (a constant offset: a process's monotonic clock never
  jumps), held, then restarted with the true clock — a clock stepped at boot, as a bad
  NTP source does;
* delete-shard-lock — a shard's primary lock deleted by hand; its holder must notice
  and the shard be led again within the consumer TTL + 2 s.

The target of a disk or clock fault is the primary of the event's journal for even
`coordinator` indexes, a replica of it for odd ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import structlog

from tools.services.disk_faults import ErrFs, errfs, fill
from topology.etcd import connect
from topology.shards import consumer_root

from .history import FaultRecord
from .schedule import FaultEvent, FaultKind

if TYPE_CHECKING:
    from .cluster import CoordinatorService

Nemesis = Any
"""The nemesis.Nemesis that calls in (its routes, target lookup, history, restarts);
not imported: it imports this module."""

__all__ = ["FAKETIME_LIB", "LocalFaults", "delete_shard_lock"]

log = structlog.get_logger("chaos.local_faults")

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
"""Debian's libfaketime (package faketime, installed by make)."""
SPOOL_SIZE = 256 << 20
"""Each coordinator's spool filesystem (RAM bounded by it; a chaos run's spools stay far
below, persisted fragments being released)."""


class LocalFaults:
    def __init__(self, spool_size: int = SPOOL_SIZE) -> None:
        self.spool_size = spool_size
        self._stack = contextlib.ExitStack()
        self.disks: dict[str, ErrFs] = {}
        """process id -> the errfs its spool sits on."""

    def prepare(self, index: int, coordinator: CoordinatorService) -> None:
        """Before the coordinator first starts: its spool on a fresh errfs."""
        fs = self._stack.enter_context(errfs(self.spool_size, f"spool-{index}"))
        coordinator.spool_dir = fs.path
        self.disks[coordinator.process_id] = fs

    def close(self) -> None:
        """Unmount every errfs (call after the coordinators stopped)."""
        self._stack.close()

    async def apply(self, nemesis: Nemesis, ev: FaultEvent, journal: str) -> None:
        primary, others = await nemesis.routes(journal)
        pid = primary if ev.coordinator % 2 == 0 or not others else others[0]
        target = nemesis._by_id(pid)  # noqa: SLF001 - the nemesis's own lookup
        fs = self.disks.get(pid or "")
        kind = ev.kind
        if target is None or not target.running or (fs is None and kind is not FaultKind.CLOCK_SKEW):
            nemesis.skipped.append(f"{kind.value}@{ev.at}: no target for {journal} ({pid})")
            return
        history = nemesis.history
        if kind is FaultKind.DISK_FULL:
            assert fs is not None
            ballast = await asyncio.to_thread(fill, fs.backing, 16 << 10)
            rec = history.fault(FaultRecord(kind.value, history.now(), target=pid or "",
                                            journal=journal, note="spool filesystem full"))
            try:
                await asyncio.sleep(ev.duration)
            finally:
                ballast.unlink(missing_ok=True)
            history.healed(rec)
        elif kind is FaultKind.DISK_ERROR:
            assert fs is not None
            mode = "eio" if ev.journal % 2 == 0 else "erofs"
            fs.fail(mode)
            rec = history.fault(FaultRecord(kind.value, history.now(), target=pid or "",
                                            journal=journal, note=mode))
            try:
                await asyncio.sleep(ev.duration)
            finally:
                fs.heal()
            await asyncio.to_thread(target.kill)
            await nemesis._restart(target)  # noqa: SLF001
            history.healed(rec)
        elif kind is FaultKind.CLOCK_SKEW:
            sign = 1 if ev.journal % 2 == 0 else -1
            skew = sign * (60 + int(ev.at * 7) % 241)  # 1 to 5 minutes, seeded by the schedule
            await self._restart_with_clock(nemesis, target, skew)
            rec = history.fault(FaultRecord(kind.value, history.now(), target=pid or "",
                                            journal=journal, note=f"clock {skew:+d} s"))
            try:
                await asyncio.sleep(ev.duration)
            finally:
                await self._restart_with_clock(nemesis, target, 0)
            history.healed(rec)

    async def _restart_with_clock(self, nemesis: Nemesis, target: CoordinatorService,
                                  skew: int) -> None:
        env = target._extra_env  # noqa: SLF001 - the service's own environment
        if skew:
            env.update({"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": f"{skew:+d}"})
        else:
            env.pop("LD_PRELOAD", None)
            env.pop("FAKETIME", None)
        await asyncio.to_thread(target.stop)
        await nemesis._restart(target)  # noqa: SLF001


async def delete_shard_lock(nemesis: Nemesis, ev: FaultEvent) -> None:
    """Delete the primary lock of shard `ev.journal`, as `etcdctl del` would."""
    consumers, etcd = nemesis.consumers, nemesis.cluster.etcd
    if consumers is None or etcd is None or not etcd.url:
        nemesis.skipped.append(f"{ev.kind.value}@{ev.at}: no consumer group")
        return
    shard, holder = await consumers.primary_of(ev.journal)
    key = f"{consumer_root(nemesis.cluster.root)}/primary/{shard}"
    client = await connect(etcd.url, timeout=5.0)
    try:
        held = await client.get(key.encode())
        if held is not None:
            await client.delete(key.encode())
    finally:
        await client.close()
    if held is None:
        nemesis.skipped.append(f"{ev.kind.value}@{ev.at}: no lock for {shard}")
        return
    history = nemesis.history
    rec = history.fault(FaultRecord(ev.kind.value, history.now(),
                                    target=holder.name if holder is not None else "",
                                    note=f"lock of {shard}"))
    await asyncio.sleep(ev.duration)
    history.healed(rec)
