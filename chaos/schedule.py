"""A seeded fault schedule: what breaks, when, for how long. Pure (no IO, no clock).

The schedule is a list of non-overlapping `FaultEvent`s on a timeline of `duration`
seconds: a warm-up with no faults, then one fault at a time (each lasting a seeded
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
    """Index of the journal whose route picks the target (process faults)."""
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
    """The events of one run, in time order. Same config, same list."""
    if cfg.duration <= 0:
        raise ValueError(f"duration must be positive, got {cfg.duration}")
    if not cfg.kinds:
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
            deck = list(cfg.kinds)
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
