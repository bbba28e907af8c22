"""A seeded fault schedule: what breaks, when, for how long. Pure (no IO, no clock).

The schedule is a list of `FaultEvent`s on a timeline of `duration` seconds, in two
tracks (broker faults; consumer faults, which may overlap the broker ones), each
non-overlapping in itself: a warm-up with no faults, then one fault at a time (each lasting a seeded
number of seconds, followed by a seeded gap), then a quiet tail (`quiesce`) so every
journal can recover before the checker reads it back. Kinds are dealt from a shuffled
deck, so a short run still sees each kind once before any kind repeats. Targets are
*roles* ("the primary of journal 3", "coordinator 2's peer link"), resolved to a process
at run time, so the same seed gives the same schedule whatever the ports and PIDs.
"""

from __future__ import annotations

import enum
import random
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CONSUMER_KINDS",
    "CONTROL_PLANE_KINDS",
    "NET_MODES",
    "FaultEvent",
    "FaultKind",
    "ScheduleConfig",
    "build_schedule",
    "faults_per_minute",
]


class FaultKind(str, enum.Enum):
    KILL_PRIMARY = "kill-primary"
    """kill -9 the primary of a journal; restart it after the fault's duration."""
    KILL_REPLICA = "kill-replica"
    """kill -9 a non-primary member of a journal's route; restart it afterwards."""
    PAUSE_PRIMARY = "pause-primary"
    """SIGSTOP the primary past the lease TTL, then SIGCONT: it must not commit."""
    ETCD_RESTART = "etcd-restart"
    """kill -9 etcd and start it again on the same data dir."""
    NET_CLIENT = "net-client"
    """A TCP fault on the client -> coordinator link of one coordinator."""
    NET_PEER = "net-peer"
    """A TCP fault on the peer -> coordinator link (replication, proxying) of one."""
    KILL_WORKER = "kill-worker"
    """kill -9 the Celery worker (mid-upload, maybe); restart it afterwards."""
    DELETE_MEMBER_KEY = "delete-member-key"
    """Delete the primary's member key in etcd by hand (`etcdctl del`): it must notice,
    fence, revoke its old lease and re-announce (topology/membership.py)."""
    REVOKE_LEASE = "revoke-lease"
    """Revoke the primary's member lease by hand: its key and assignments vanish at once."""
    ETCD_COMPACT = "etcd-compact"
    """Compact etcd to its current revision: every watch that restarts must re-list."""
    PAUSE_ETCD = "pause-etcd"
    """SIGSTOP etcd past the lease TTL, then SIGCONT: members must stop leading while
    they cannot confirm their leases, and survive leases expiring on wake-up."""
    KILL_CONSUMER = "kill-consumer"
    """kill -9 the consumer member that is primary of a shard; restart it afterwards
    (same id and data dir): its shards move to the others within its lease TTL."""
    PAUSE_CONSUMER = "pause-consumer"
    """SIGSTOP a shard's primary consumer member past its lease TTL, then SIGCONT: the
    zombie must not commit to the shard's recovery log (its successor fenced it)."""
    DELETE_SHARD_LOCK = "delete-shard-lock"
    """Delete a shard's primary lock by hand (`etcdctl del <root>/consumers/primary/<id>`):
    its holder must notice, stop writing, and the shard be led again within TTL + 2 s."""
    # Faults of one coordinator's disk and clock (chaos/local_faults.py): their spools
    # sit on errfs over a small tmpfs, their clocks under faketime.
    DISK_FULL = "disk-full"
    """Fill a coordinator's spool filesystem (ENOSPC) for the fault's duration."""
    DISK_ERROR = "disk-error"
    """Make a coordinator's spool fail (EIO or EROFS); healed by a restart on a good disk."""
    CLOCK_SKEW = "clock-skew"
    """Restart a coordinator with its clock minutes off (faketime), then without."""
    # Network-layer faults of `quire chaos --hosts` (chaos/net_faults.py plays them).
    ISOLATE_HOST = "isolate-host"
    PARTITION_PRIMARY_REPLICAS = "partition-primary-replicas"
    PARTITION_PRIMARY_ETCD = "partition-primary-etcd"
    ISOLATE_ETCD_MEMBER = "isolate-etcd-member"
    CUT_ETCD_QUORUM = "cut-etcd-quorum"
    KILL_HOST = "kill-host"


NET_MODES = ("blackhole", "delay", "reset", "one-way", "slice")

DEFAULT_KINDS = (
    FaultKind.KILL_PRIMARY,
    FaultKind.KILL_REPLICA,
    FaultKind.PAUSE_PRIMARY,
    FaultKind.ETCD_RESTART,
    FaultKind.NET_CLIENT,
    FaultKind.NET_PEER,
    FaultKind.DELETE_MEMBER_KEY,
    FaultKind.REVOKE_LEASE,
    FaultKind.ETCD_COMPACT,
    FaultKind.PAUSE_ETCD,
)

CONSUMER_KINDS = (FaultKind.KILL_CONSUMER, FaultKind.PAUSE_CONSUMER, FaultKind.DELETE_SHARD_LOCK)
"""Faults of the consumer group (`quire chaos` runs one unless --no-consumers). They
form a second track of the schedule, beside the broker faults: see build_schedule."""

DISK_KINDS = (FaultKind.DISK_FULL, FaultKind.DISK_ERROR, FaultKind.CLOCK_SKEW)
"""Faults of a coordinator's disk and clock: need root (mounts), errfs and faketime."""

CONTROL_PLANE_KINDS = (FaultKind.DELETE_MEMBER_KEY, FaultKind.REVOKE_LEASE, FaultKind.ETCD_COMPACT,
                       FaultKind.PAUSE_ETCD)

INSTANT_KINDS = frozenset({FaultKind.DELETE_MEMBER_KEY, FaultKind.REVOKE_LEASE,
                           FaultKind.ETCD_COMPACT})
"""Faults that are one etcd call: held (no new fault) for 1-3 s while the cluster reacts."""


@dataclass(frozen=True)
class FaultEvent:
    at: float
    """Seconds after the run started."""
    kind: FaultKind
    duration: float
    """Seconds until the fault is healed (restart, SIGCONT, pass)."""
    journal: int = 0
    """Index of the journal whose route picks the target (process faults); for consumer
    faults, the index of the shard whose primary member is the target."""
    coordinator: int = 0
    """Index of the coordinator whose link is faulted (network faults)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Network mode and its parameters (mode, delay, jitter, direction, slice_max)."""

    @property
    def ends(self) -> float:
        return self.at + self.duration

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind.value
        return d


@dataclass(frozen=True)
class ScheduleConfig:
    duration: float
    seed: int = 0
    journals: int = 8
    coordinators: int = 5
    lease_ttl: float = 5.0
    kinds: tuple[FaultKind, ...] = DEFAULT_KINDS
    warmup: float = 5.0
    shards: int = 4
    """Consumer shards (consumer faults target the primary of shard `journal`)."""
    consumer_ttl: float | None = None
    """Consumer member lease TTL (default: lease_ttl); pause-consumer lasts past it."""
    quiesce: float | None = None
    """Quiet tail; default 20% of the run, between 10 and 60 seconds."""
    fault_seconds: tuple[float, float] | None = None
    """Length of a fault; default 4-10 s, or 3-8 s for runs under two minutes."""
    gap_seconds: tuple[float, float] | None = None
    """Quiet time between faults; default 2-5 s, or 2-4 s for runs under two minutes."""

    @property
    def tail(self) -> float:
        if self.quiesce is not None:
            return self.quiesce
        return min(60.0, max(10.0, 0.2 * self.duration))


def _net_params(rng: random.Random) -> dict[str, Any]:
    mode = rng.choice(NET_MODES)
    params: dict[str, Any] = {"mode": mode}
    if mode == "delay":
        params.update(delay=round(rng.uniform(0.05, 0.5), 3), jitter=round(rng.uniform(0, 0.1), 3))
    elif mode == "one-way":
        params["direction"] = rng.choice(("up", "down"))
    elif mode == "slice":
        params["slice_max"] = rng.randint(1, 7)
    return params


def build_schedule(cfg: ScheduleConfig) -> list[FaultEvent]:
    """The events of one run, in time order. Same config, same list.

    Two tracks, each non-overlapping in itself: the broker faults (every kind but the
    consumer ones, dealt exactly as before consumer faults existed, so a seed's broker
    schedule does not change when consumers are on) and the consumer faults
    (CONSUMER_KINDS, from their own seeded deck, one every ~10 s from shortly after the
    warm-up). Consumer faults hit other processes than broker faults, so the two tracks
    may overlap in time; a 60 s run sees about three of them."""
    if cfg.duration <= 0:
        raise ValueError(f"duration must be positive, got {cfg.duration}")
    broker = tuple(k for k in cfg.kinds if k not in CONSUMER_KINDS)
    consumer = tuple(k for k in cfg.kinds if k in CONSUMER_KINDS)
    events = _broker_track(cfg, broker) + _consumer_track(cfg, consumer)
    return sorted(events, key=lambda ev: ev.at)


def _consumer_track(cfg: ScheduleConfig, kinds: tuple[FaultKind, ...]) -> list[FaultEvent]:
    if not kinds:
        return []
    rng = random.Random(f"consumer-{cfg.seed}")
    ttl = cfg.consumer_ttl if cfg.consumer_ttl is not None else cfg.lease_ttl
    end = cfg.duration - cfg.tail
    events: list[FaultEvent] = []
    deck: list[FaultKind] = []
    t = cfg.warmup + 3.0  # the group has taken its shards and committed once
    while True:
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        kind = deck.pop()
        length = ttl + rng.uniform(1.0, 4.0) if kind is FaultKind.PAUSE_CONSUMER \
            else rng.uniform(3.0, 8.0)
        if t + length > end:
            break
        events.append(FaultEvent(at=round(t, 3), kind=kind, duration=round(length, 3),
                                 journal=rng.randrange(max(1, cfg.shards))))
        t += length + rng.uniform(3.0, 6.0)
    return events


def _broker_track(cfg: ScheduleConfig, kinds: tuple[FaultKind, ...]) -> list[FaultEvent]:
    if not kinds:
        return []
    rng = random.Random(cfg.seed)
    end = cfg.duration - cfg.tail
    events: list[FaultEvent] = []
    deck: list[FaultKind] = []
    t = cfg.warmup
    short = cfg.duration < 120
    # At least 3 faults a minute with the default kinds (issue #21).
    lo, hi = cfg.fault_seconds or ((3.0, 8.0) if short else (4.0, 10.0))
    gap = cfg.gap_seconds or ((2.0, 4.0) if short else (2.0, 5.0))
    while True:
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        kind = deck.pop()
        if kind in (FaultKind.PAUSE_PRIMARY, FaultKind.PAUSE_ETCD):
            # Past the lease TTL, so peers give up on it while it sleeps (etcd: leases
            # may expire as it wakes; members stop leading meanwhile).
            length = cfg.lease_ttl + rng.uniform(1.0, 4.0)
        elif kind in INSTANT_KINDS:
            length = rng.uniform(1.0, 3.0)
        else:
            length = rng.uniform(lo, hi)
        if t + length > end:
            break
        params = _net_params(rng) if kind in (FaultKind.NET_CLIENT, FaultKind.NET_PEER) else {}
        events.append(FaultEvent(
            at=round(t, 3), kind=kind, duration=round(length, 3),
            journal=rng.randrange(cfg.journals), coordinator=rng.randrange(cfg.coordinators),
            params=params,
        ))
        t += length + rng.uniform(*gap)
    return events


def summarize(events: list[FaultEvent]) -> dict[str, int]:
    """Count of events by kind (network faults as `net-client:blackhole`, ...)."""
    out: dict[str, int] = {}
    for ev in events:
        key = ev.kind.value + (f":{ev.params['mode']}" if "mode" in ev.params else "")
        out[key] = out.get(key, 0) + 1
    return out


def faults_per_minute(events: list[FaultEvent], duration: float) -> float:
    """Faults injected per minute of the whole run (warm-up and quiet tail included)."""
    return round(len(events) * 60.0 / duration, 2) if duration > 0 else 0.0
