"""The cluster of `quire chaos --hosts N`: every process on a simulated host (tools/hosts).

    N coordinator hosts   c0..c{N-1}, one coordinator each, zones a, a, b, c, c, ...
                          (over three zones), listening on and advertising the host's
                          address
    3 etcd hosts          e0, e1, e2 (zones a, b, c): one member of a three-member etcd
                          each, so a primary can be cut from its replicas but not from
                          etcd, and the other way round
    store host            moto S3 and Redis (never killed: moto keeps objects in memory)
    worker host           the Celery worker (persist, index, pulse)
    consumer hosts        one per consumer member (placed by the runner)
    observer              the root namespace: writers, readers, the checker

The same surface as `chaos.cluster.LocalCluster` (etcd, coordinators, worker, s3,
redis, endpoints, service_env, root, workdir), so the runner, the read-back and the
consumer group take either; `harness`, `etcd_hosts` and `host_of` are for the network
faults (chaos/net_faults.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from tools.hosts import Host, HostHarness
from tools.services import CeleryWorkerService, RedisService, S3Service, ServiceError
from tools.services.etcd import EtcdCluster

from .cluster import CoordinatorService, cluster_env

__all__ = ["HostCluster", "HostCoordinator", "host_zones"]

log = structlog.get_logger("chaos.host_cluster")

PORT = 8080


def host_zones(n: int) -> list[str]:
    """Zones of n coordinator hosts over three zones: a, a, b, c, c for five."""
    if n < 3:
        raise ValueError(f"--hosts: at least 3 coordinator hosts (three zones), got {n}")
    return [("zone-a", "zone-b", "zone-c")[round(i * 2 / (n - 1))] for i in range(n)]


class HostCoordinator(CoordinatorService):
    """A coordinator on a host: listens on (and so advertises) the host's address."""

    def __init__(self, name: str, *, host: Host, **kwargs: Any) -> None:
        self.host = host
        super().__init__(name, port=PORT, **kwargs)
        host.adopt(self)

    @property
    def endpoint(self) -> str:
        return f"{self.host.address}:{self.port}"


class HostCluster:
    def __init__(self, n: int = 5, *, consumers: int = 0, root: str = "/quire",
                 env: dict[str, str] | None = None, workdir: str | Path | None = None,
                 worker: bool = True) -> None:
        self.n = n
        self.zones = host_zones(n)
        self.root = root
        self.env = dict(env or {})
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="quire-hostchaos-"))
        names = ([*self.zones] + ["zone-a", "zone-b", "zone-c"] + ["store", "worker"]
                 + ["consumers"] * consumers)
        self.harness = HostHarness(len(names), zones=names, workdir=self.workdir / "hosts")
        self.want_worker = worker
        self.consumer_count = consumers
        self.etcd: EtcdCluster | None = None
        self.s3: S3Service | None = None
        self.redis: RedisService | None = None
        self.worker: CeleryWorkerService | None = None
        self.coordinators: list[HostCoordinator] = []

    # -- hosts by role ------------------------------------------------------------

    @property
    def coordinator_hosts(self) -> list[Host]:
        return self.harness.hosts[:self.n]

    @property
    def etcd_hosts(self) -> list[Host]:
        return self.harness.hosts[self.n:self.n + 3]

    @property
    def store_host(self) -> Host:
        return self.harness.hosts[self.n + 3]

    @property
    def worker_host(self) -> Host:
        return self.harness.hosts[self.n + 4]

    @property
    def consumer_hosts(self) -> list[Host]:
        return self.harness.hosts[self.n + 5:]

    def host_of(self, coordinator: HostCoordinator) -> Host:
        return coordinator.host

    @property
    def endpoints(self) -> list[str]:
        return [c.endpoint for c in self.coordinators]

    @property
    def layout(self) -> dict[str, str]:
        """host name -> what runs there (for the run's metadata)."""
        out = {h.name: f"coordinator {h.zone}" for h in self.coordinator_hosts}
        out.update({h.name: f"etcd {h.zone}" for h in self.etcd_hosts})
        out[self.store_host.name] = "s3, redis"
        out[self.worker_host.name] = "celery worker"
        out.update({h.name: "consumer member" for h in self.consumer_hosts})
        return {name: f"{what} ({self.harness.hosts[int(name[1:])].address})"
                for name, what in out.items()}

    def service_env(self) -> dict[str, str]:
        return cluster_env(self.env, self.root, self.s3, self.redis, self.etcd)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> HostCluster:
        try:
            self.harness.start()
            self.etcd = self.harness.etcd_cluster(self.etcd_hosts).start()
            st = self.store_host
            self.s3 = st.adopt(S3Service("s3", listen_host=st.address, workdir=st.workdir / "s3"))
            self.redis = st.adopt(RedisService("redis", listen_host=st.address,
                                               workdir=st.workdir / "redis"))
            self.s3.start(wait=False)
            self.redis.start()
            self.s3.wait_ready()
            for i, host in enumerate(self.coordinator_hosts):
                self.coordinators.append(HostCoordinator(
                    f"coord-{i}", host=host, zone=host.zone, suffix=f"coord{i}",
                    etcd_url=self.etcd.url, root=self.root, redis_url=self.redis.url,
                    env=self.service_env(), workdir=host.workdir / f"coord-{i}"))
            for c in self.coordinators:
                c.start(wait=False)
            for c in self.coordinators:
                c.wait_ready()
            if self.want_worker:
                wh = self.worker_host
                self.worker = wh.adopt(CeleryWorkerService(
                    "worker", redis_url=self.redis.url, queues=("persist", "index", "pulse"),
                    env=self.service_env(), workdir=wh.workdir / "worker"))
                self.worker.start()
        except BaseException:
            self.close()
            raise
        log.info("host_cluster.started", layout=self.layout)
        return self

    def close(self) -> None:
        for svc in [self.worker, *reversed(self.coordinators), self.redis, self.s3]:
            if svc is not None:
                try:
                    svc.stop(timeout=5)
                except ServiceError as exc:
                    log.warning("host_cluster.stop_failed", service=svc.name, error=str(exc))
        if self.etcd is not None:
            try:
                self.etcd.close()
            except ServiceError as exc:
                log.warning("host_cluster.stop_failed", service="etcd", error=str(exc))
        self.harness.close()

    def __enter__(self) -> HostCluster:
        return self.start()

    def __exit__(self, *exc: Sequence[object]) -> None:
        self.close()
