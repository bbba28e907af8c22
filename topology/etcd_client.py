"""An etcd client for a cluster, not a member: several endpoints, failover, TLS.

etcd is three (or five) members; a client that knows one of them loses the control
plane when that member dies although the cluster still has quorum. `EtcdClient` is
aetcd's client with what etcd's own Go client (clientv3) adds:

- **Several endpoints** (`http://a:2379,http://b:2379,http://c:2379`). The client talks
  to one member at a time and keeps one gRPC channel per member, created on first use
  and never closed before the client is (a channel to a dead member reconnects by
  itself when the member is back; closing a channel would cancel calls still on it).
- **Spread**: each client starts at a member picked at random, as clientv3's balancer
  spreads its connections, so one member's death or isolation reaches about a third of
  a cluster's processes rather than all of them (with every coordinator on one member,
  isolating that member's host left every lease unrefreshed until all had failed over,
  and with a short TTL every coordinator lost its membership at once).
- **Failover**: `fail_over()` moves every later call to the next member. It is called
  by `txn` and `watch_events` on UNAVAILABLE (etcd's "no leader", "request timed out",
  a refused or dropped connection) and, while a client of several endpoints is open,
  by a health check that asks the current member for its status each second and moves
  on when the member does not answer or has no leader (a member cut off from the
  quorum still accepts connections: without this check a client would stay with it).
  Watches carry etcd's `hasleader` metadata, so a member that loses its leader cancels
  them and the watcher re-watches, through the next member, from its last revision.
  Leases are the cluster's: a keep-alive sent to another member refreshes the same
  lease.
- **TLS** with a client certificate (`https://` endpoints and `EtcdTLS`): with etcd's
  `--client-cert-auth` and auth enabled, the certificate's common name is the etcd
  user the client acts as (docs/security.md), so no password is kept anywhere.

Every quire process builds its etcd client through `topology.etcd.connect` (or
`client_for`), which parses the endpoints and reads the TLS files from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aetcd
import grpc
import structlog
from aetcd import rpc

from protocol.errors import QuireError

__all__ = ["EtcdClient", "EtcdEndpointError", "EtcdTLS", "Endpoint", "parse_endpoints"]

log = structlog.get_logger("quire.etcd")

HEALTH_INTERVAL = 1.0
"""Seconds between health checks of the current member (several endpoints only)."""
HEALTH_TIMEOUT = 1.5
"""A member that does not answer its status within this is left for the next one."""

FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""gRPC codes that say the member (not the request) is the problem."""


class EtcdEndpointError(QuireError, ValueError):
    """The etcd URL list, or the TLS files for it, are not usable."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    secure: bool

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.target}"


@dataclass(frozen=True)
class EtcdTLS:
    """PEM files: the CA etcd's server certificates chain to, and this client's own
    certificate and key (whose common name is the etcd user it acts as)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtcdTLS | None:
        """QUIRE_ETCD_CA / QUIRE_ETCD_CERT / QUIRE_ETCD_KEY, or None when no CA is set."""
        env = os.environ if env is None else env
        ca = env.get("QUIRE_ETCD_CA") or None
        if ca is None:
            return None
        return cls(ca, env.get("QUIRE_ETCD_CERT") or None, env.get("QUIRE_ETCD_KEY") or None)

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise EtcdEndpointError("etcd TLS: QUIRE_ETCD_CERT and QUIRE_ETCD_KEY go together")

        def read(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise EtcdEndpointError(f"etcd TLS: cannot read the {what} {path}: "
                                        f"{exc.strerror or exc}") from None

        return grpc.ssl_channel_credentials(root_certificates=read(self.ca, "CA file"),
                                            private_key=read(self.key, "key file"),
                                            certificate_chain=read(self.cert, "certificate file"))


def parse_endpoints(urls: str | list[str] | tuple[str, ...]) -> list[Endpoint]:
    """`http://a:2379,https://b:2379` (or a list, or bare `host:port`) as endpoints.

    All endpoints of one client use the same scheme: a cluster either serves TLS on
    its client URLs or it does not."""
    parts = [p.strip() for p in (urls.split(",") if isinstance(urls, str) else urls)]
    parts = [p for p in parts if p]
    if not parts:
        raise EtcdEndpointError("no etcd endpoint given (QUIRE_ETCD_URL, e.g. http://127.0.0.1:2379)")
    out: list[Endpoint] = []
    for part in parts:
        u = urllib.parse.urlsplit(part if "://" in part else f"http://{part}")
        try:
            port = u.port or 2379
        except ValueError:
            port = -1
        if u.scheme not in ("http", "https") or not u.hostname or port <= 0:
            raise EtcdEndpointError(f"etcd endpoint {part!r}: expected http(s)://host:port")
        out.append(Endpoint(u.hostname, port, u.scheme == "https"))
    if len({e.secure for e in out}) > 1:
        raise EtcdEndpointError(f"etcd endpoints {urls!r}: mix http:// and https://")
    return out


RECONNECT_BACKOFF_MAX_MS = 3000
"""Longest wait between gRPC's attempts to reconnect to an unreachable etcd member."""


MAX_RECEIVE = (1 << 31) - 1
"""Largest etcd answer accepted, bytes (etcd clientv3's default)."""


class EtcdClient(aetcd.Client):
    """aetcd's client over one member at a time of several, moving on when it fails."""

    def __init__(self, endpoints: list[Endpoint], *, tls: EtcdTLS | None = None,
                 timeout: float | None = 10.0) -> None:
        first = endpoints[0]
        super().__init__(host=first.host, port=first.port, timeout=timeout,
                         options={"grpc.keepalive_time_ms": 5000,
                                  "grpc.keepalive_timeout_ms": 3000,
                                  "grpc.keepalive_permit_without_calls": 1,
                                  "grpc.http2.max_pings_without_data": 0,
                                  # gRPC's reconnect backoff grows to 120 s by default: a
                                  # member cut off from etcd for a minute could then wait
                                  # about as long again after the heal before it even
                                  # tried (its lease, watch and rejoin all stalled).
                                  # Bounded, a healed member reconnects within seconds.
                                  "grpc.initial_reconnect_backoff_ms": 500,
                                  "grpc.max_reconnect_backoff_ms": RECONNECT_BACKOFF_MAX_MS,
                                  # gRPC refuses answers over 4 MiB by default; a read of
                                  # the whole root at 10,000 journals (a KeySpace load or
                                  # re-list, a List) is ~13 MB. etcd's own client
                                  # accepts any size (MaxCallRecvMsgSize: MaxInt32).
                                  "grpc.max_receive_message_length": MAX_RECEIVE})
        if first.secure and tls is None:
            raise EtcdEndpointError(f"etcd endpoint {first} is https:// but no CA is set "
                                    "(QUIRE_ETCD_CA)")
        self.endpoints = endpoints
        self.tls = tls if first.secure else None
        self._credentials = self.tls.credentials() if self.tls else None
        self._current = random.randrange(len(endpoints))  # the spread (module doc)
        self._channels: dict[int, Any] = {}
        self._health: asyncio.Task[None] | None = None
        self.failovers = 0

    @property
    def url(self) -> str:
        return ",".join(str(e) for e in self.endpoints)

    @property
    def current(self) -> Endpoint:
        return self.endpoints[self._current]

    def _channel(self, index: int) -> Any:
        channel = self._channels.get(index)
        if channel is None:
            target = self.endpoints[index].target
            options = list(self._options.items())
            if self._credentials is not None:
                channel = rpc.secure_channel(target, self._credentials, options=options)
            else:
                channel = rpc.insecure_channel(target, options=options)
            self._channels[index] = channel
        return channel

    async def connect(self) -> None:
        """Point the stubs at the current member's channel (cheap when already there)."""
        if self._connected.is_set():
            return
        self.channel = self._channel(self._current)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self.auth_stub = rpc.AuthStub(self.channel)
        self._watcher = None  # quire watches through topology.watch, not aetcd's watcher
        self._connected.set()
        if len(self.endpoints) > 1 and self._health is None:
            self._health = asyncio.get_running_loop().create_task(
                self._check_health(), name=f"etcd-health-{id(self):x}")

    def fail_over(self, reason: str, *, channel: Any = None) -> None:
        """Move later calls to the next member; a no-op with one endpoint, or when
        `channel` (the one a failed call used) is no longer the current one."""
        if len(self.endpoints) < 2:
            return
        if channel is not None and channel is not self._channels.get(self._current):
            return  # an older failure: we already moved on
        before = self.current
        self._current = (self._current + 1) % len(self.endpoints)
        self._connected.clear()
        self.failovers += 1
        log.warning("etcd member failed; using the next one", member=str(before),
                    next=str(self.current), reason=reason[:200])

    def note(self, exc: BaseException, channel: Any = None) -> None:
        """Fail over if `exc` (a gRPC error of a call on `channel`) blames the member."""
        if isinstance(exc, rpc.AioRpcError) and exc.code() in FAILOVER_CODES:
            self.fail_over(f"{exc.code().name}: {exc.details()}", channel=channel)

    async def _check_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL)
            channel = self._channel(self._current)
            try:
                status = await rpc.MaintenanceStub(channel).Status(
                    rpc.StatusRequest(), timeout=HEALTH_TIMEOUT, metadata=self.metadata)
            except rpc.AioRpcError as exc:
                self.fail_over(f"status: {exc.code().name}: {exc.details()}", channel=channel)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken channel: try the next member
                self.fail_over(f"status: {exc!r}", channel=channel)
                continue
            if not status.leader:
                self.fail_over("the member has no leader", channel=channel)

    async def close(self) -> None:
        health, self._health = self._health, None
        if health is not None:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await health
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close()
        self._init_channel_attrs()
        self._connected.clear()
