"""Settings of the workers role that are not shared with other processes.

The shared ones (Redis, etcd, store credentials) come from `protocol.config`. These
are tuning knobs read from `QUIRE_WORKER_*` environment variables, validated once
with errors that name the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from protocol.config import ConfigError

__all__ = ["WorkerSettings", "load_worker_settings"]


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    visibility_timeout: float = 1800.0
    """Seconds before Redis redelivers an unacknowledged task (a worker died holding it).
    Must exceed the longest persist; tests lower it to see redelivery quickly."""
    index_sweep_interval: float = 5.0
    """How often beat runs `workers.index.sweep`; each journal is refreshed when its
    own `fragment.refresh_interval` has elapsed, so this only bounds the jitter."""
    pulse_interval: float = 60.0
    """How often beat runs `workers.pulse.sweep` (a zero-byte append per journal)."""
    prune_interval: float = 300.0
    """How often beat runs `workers.prune.sweep` (one `prune_journal` per journal with a
    retention)."""
    io_timeout: float = 30.0
    """Socket timeout for replica fetches, etcd calls, Redis and store requests."""
    persist_time_limit: float = 600.0
    """Hard limit of one persist task (prefork pool); the soft limit is 90% of it."""
    persist_read_rate: int = 0
    """Bytes/s cap on reading a fragment from a replica (0 = unlimited), to keep
    persistence from starving appends of disk and network."""
    metrics_port: int = 0
    """Serve Prometheus metrics on this port in the worker's main process (0 = off)."""
    metrics_addr: str = "127.0.0.1"
    """Address the metrics server binds (QUIRE_WORKER_METRICS_ADDR; 0.0.0.0: every
    interface). Loopback unless an address is given."""
    stores: tuple[str, ...] = ()
    """Store URLs a persist task may write to besides QUIRE_STORE_URL
    (QUIRE_WORKER_STORES, comma-separated). A message naming another store is refused."""
    jobs_interval: float = 5.0
    """How often beat runs `workers.jobs.sweep` (creates and dispatches job runs)."""
    mark_retention: float = 604800.0
    """Seconds a journal's watermark marks are kept (windows older than that can still be
    backfilled, but their edges fold into the oldest kept mark)."""
    scrub_interval: float = 86400.0
    """The scrub period: how often beat runs `workers.scrub.sweep`, one pass proving
    every persisted fragment by its SHA-1 (workers/scrub.py)."""
    scrub_rate: int = 8 << 20
    """Content bytes/s a scrub pass may prove (0 = unlimited): it shares the stores with
    persistence and must not starve it."""
    job_lease_ttl: int = 15
    """Seconds of a running job run's etcd lease: a worker that dies mid-run loses its run
    this long after, and the run is retried."""


_FIELDS = {
    "visibility_timeout": ("QUIRE_WORKER_VISIBILITY_TIMEOUT", float, 1.0),
    "index_sweep_interval": ("QUIRE_WORKER_INDEX_SWEEP_INTERVAL", float, 0.1),
    "pulse_interval": ("QUIRE_WORKER_PULSE_INTERVAL", float, 0.1),
    "prune_interval": ("QUIRE_WORKER_PRUNE_INTERVAL", float, 0.1),
    "io_timeout": ("QUIRE_WORKER_IO_TIMEOUT", float, 0.1),
    "persist_time_limit": ("QUIRE_WORKER_PERSIST_TIME_LIMIT", float, 1.0),
    "persist_read_rate": ("QUIRE_WORKER_PERSIST_READ_RATE", int, 0),
    "metrics_port": ("QUIRE_WORKER_METRICS_PORT", int, 0),
    "jobs_interval": ("QUIRE_WORKER_JOBS_INTERVAL", float, 0.1),
    "job_lease_ttl": ("QUIRE_WORKER_JOB_LEASE_TTL", int, 2),
    "mark_retention": ("QUIRE_WORKER_MARK_RETENTION", float, 60.0),
    "scrub_interval": ("QUIRE_WORKER_SCRUB_INTERVAL", float, 0.1),
    "scrub_rate": ("QUIRE_WORKER_SCRUB_RATE", int, 0),
}


_TEXT_FIELDS = {"metrics_addr": "QUIRE_WORKER_METRICS_ADDR", "stores": "QUIRE_WORKER_STORES"}
"""The settings that are not numbers (read below)."""


def load_worker_settings(env: Mapping[str, str] | None = None) -> WorkerSettings:
    env = os.environ if env is None else env
    values: dict[str, float | int] = {}
    for field, (var, kind, minimum) in _FIELDS.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"{var}: expected a number, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"{var}: expected a number >= {minimum}, got {raw!r}")
        values[field] = value
    extra: dict[str, object] = {}
    addr = env.get(_TEXT_FIELDS["metrics_addr"], "").strip()
    if addr:
        extra["metrics_addr"] = addr
    stores = tuple(s.strip() for s in env.get(_TEXT_FIELDS["stores"], "").split(",") if s.strip())
    if stores:
        extra["stores"] = stores
    return WorkerSettings(**values, **extra)  # type: ignore[arg-type]
