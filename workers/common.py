"""What the task modules share: settings, a Redis client, stores, sweep locks.

Clients are created lazily, and the Redis client once per process id, so prefork
children never share a socket with the parent.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from protocol.config import Settings
from protocol.credentials import settings_token
from protocol.tls import settings_client_ssl
from quire.client.client import Client
from workers.config import WorkerSettings
from workers.topology import Topology, read_topology_sync

__all__ = ["redis_client", "settings", "store", "sweep_lock", "sweep_topology", "worker_settings"]

_lock = threading.Lock()
_redis: tuple[int, redis.Redis] | None = None


def settings() -> Settings:
    from workers.app import app

    return app.conf.quire_settings  # type: ignore[no-any-return]


def worker_settings() -> WorkerSettings:
    from workers.app import app

    return app.conf.quire_worker  # type: ignore[no-any-return]


def redis_client() -> redis.Redis:
    """A process-wide Redis client (connection pool) with IO timeouts."""
    global _redis
    with _lock:
        if _redis is None or _redis[0] != os.getpid():
            io = worker_settings().io_timeout
            client = redis.Redis.from_url(settings().redis_url, socket_timeout=io,
                                          socket_connect_timeout=min(io, 5.0),
                                          health_check_interval=10)
            _redis = (os.getpid(), client)
        return _redis[1]


def store(url: str) -> Any:
    """The fragment store at `url`, configured with this worker's S3 credentials
    (`open_store` caches one per URL and options)."""
    from fragment_store import open_store

    if not url.startswith("s3://"):
        return open_store(url)
    s = settings()
    io = worker_settings().io_timeout
    options: dict[str, Any] = {"read_timeout": io, "connect_timeout": min(io, 5.0)}
    # Explicit settings (env or QUIRE_CONFIG file) win over the store's own env lookup.
    if s.s3_endpoint:
        options["endpoint"] = s.s3_endpoint
        if "://" not in s.s3_endpoint:
            options["secure"] = s.s3_secure
    if s.s3_access_key:
        options["access_key"] = s.s3_access_key
    if s.s3_secret_key:
        options["secret_key"] = s.s3_secret_key.reveal()
    if s.s3_region:
        options["region"] = s.s3_region
    return open_store(url, **options)


@contextmanager
def sweep_lock(name: str, ttl: float) -> Iterator[bool]:
    """A Redis lock so overlapping sweeps (a slow one, a duplicate beat) do not
    fan out the same work twice. Yields whether we hold it."""
    client = redis_client()
    key = f"quire:lock:{name}-sweep"
    token = uuid.uuid4().hex
    held = bool(client.set(key, token, nx=True, px=int(ttl * 1000)))
    try:
        yield held
    finally:
        if held:
            # Release only our own lock (it may have expired and been retaken).
            client.eval("if redis.call('get', KEYS[1]) == ARGV[1] then "
                        "return redis.call('del', KEYS[1]) else return 0 end", 1, key, token)


@contextmanager
def sweep_topology(name: str, interval: float, *,
                   endpoints: bool = True) -> Iterator[Topology | None]:
    """What every beat sweep starts with: hold the `name` sweep lock (ttl: the sweep's
    `interval`, at least 5 s) and read the whole topology from etcd once (`endpoints`
    False: the specs alone). Yields None when another sweep holds the lock (the caller
    skips its run)."""
    ws = worker_settings()
    s = settings()
    with sweep_lock(name, ttl=max(5.0, interval)) as held:
        yield read_topology_sync(s.etcd_url, s.etcd_root, timeout=ws.io_timeout,
                                 endpoints=endpoints) if held else None


def coordinator_client(endpoints: list[str]) -> Client:
    """A client of the coordinators at `endpoints`, with this worker's timeouts, token and
    TLS (pulses and the jobs scheduler's rolls)."""
    ws, s = worker_settings(), settings()
    return Client(endpoints, connect_timeout=min(5.0, ws.io_timeout),
                  rpc_timeout=ws.io_timeout, retry_timeout=ws.io_timeout,
                  token=settings_token(s), ssl=settings_client_ssl(s))
