"""A local quire cluster of real processes, for `quire chaos` and `quire bench`.

etcd, optionally redis-server, the S3 server and a Celery worker (tools.services), and N
coordinator subprocesses (`python -m coordinator.main ...`, never imported: chaos is a
layer-4 package and drives roles as processes). Each coordinator is a `Service`, so the
runner can `kill()` (SIGKILL), `start()` it again on the same port and spool dir,
`pause()` (SIGSTOP) and `resume()` (SIGCONT) it.

Coordinators are ready once they answer a Hello on their socket. With `advertise`, a
coordinator listens on its own port but announces another `host:port` in etcd (a proxy),
so peer traffic can be faulted; that needs the server's `--advertise` flag, which
`supports_advertise()` looks for in its `--help`.
"""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from protocol import Hello, HelloAck
from protocol.wire import PREFIX_SIZE, check_prefix, decode_header, encode_frame_bytes
from tools.services import (
    CeleryWorkerService,
    EtcdService,
    RedisService,
    S3Service,
    Service,
    ServiceError,
    free_port,
)

__all__ = ["CoordinatorService", "LocalCluster", "hello", "supports_advertise",
           "coordinator_available"]

log = structlog.get_logger("chaos.cluster")


def hello(endpoint: str, timeout: float = 1.0) -> HelloAck:
    """A blocking Hello -> HelloAck on a fresh connection (the readiness probe)."""
    host, _, port = endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(encode_frame_bytes(Hello()))
        buf = b""
        while len(buf) < PREFIX_SIZE:
            chunk = s.recv(PREFIX_SIZE - len(buf))
            if not chunk:
                raise ConnectionError(f"{endpoint} closed before answering Hello")
            buf += chunk
        kind, hlen, plen = check_prefix(buf)
        body = b""
        while len(body) < hlen + plen:
            chunk = s.recv(hlen + plen - len(body))
            if not chunk:
                raise ConnectionError(f"{endpoint} closed mid-frame")
            body += chunk
    msg = decode_header(kind, body[:hlen])
    if not isinstance(msg, HelloAck):
        raise ConnectionError(f"{endpoint} answered Hello with {type(msg).__name__}")
    return msg


def coordinator_available() -> bool:
    """True if `python -m coordinator.main` can run (found without importing it)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("coordinator")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(loc) / "main.py").exists() for loc in spec.submodule_search_locations)


@functools.lru_cache(maxsize=1)
def supports_advertise() -> bool:
    try:
        out = subprocess.run([sys.executable, "-m", "coordinator.main", "--help"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--advertise" in out.stdout + out.stderr


class CoordinatorService(Service):
    ready_timeout = 60.0
    stop_timeout = 15.0

    def __init__(self, name: str, *, zone: str, suffix: str, etcd_url: str, root: str,
                 port: int | None = None, advertise: str | None = None,
                 redis_url: str | None = None, env: dict[str, str] | None = None,
                 extra_args: Sequence[str] = (), **kwargs: Any) -> None:
        merged = {"PYTHONUNBUFFERED": "1", "QUIRE_LOG_FORMAT": "json"}
        merged.update(env or {})
        super().__init__(name, env=merged, **kwargs)
        self.zone, self.suffix = zone, suffix
        self.etcd_url, self.root = etcd_url, root
        self.port = port or free_port()
        self.advertise = advertise
        self.redis_url = redis_url
        self.extra_args = list(extra_args)
        self.spool_dir = self.workdir / "spool"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def process_id(self) -> str:
        return f"{self.zone}#{self.suffix}"

    def describe(self) -> str:
        return self.endpoint + (f" (advertises {self.advertise})" if self.advertise else "")

    def build_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "coordinator.main", "--zone", self.zone, "--id", self.suffix,
                "--listen", self.endpoint, "--etcd", self.etcd_url, "--root", self.root,
                "--spool-dir", str(self.spool_dir)]
        if self.redis_url:
            argv += ["--redis", self.redis_url]
        if self.advertise:
            argv += ["--advertise", self.advertise]
        return argv + self.extra_args

    def probe(self) -> bool:
        hello(self.endpoint)
        return True

    def rss_bytes(self) -> int:
        """Resident set size of the coordinator process (VmRSS)."""
        if self.pid is None:
            raise ServiceError(f"{self.name} is not running")
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise ServiceError(f"no VmRSS for pid {self.pid}")


def cluster_env(base: dict[str, str], root: str, s3: Any, redis: Any, etcd: Any) -> dict[str, str]:
    """The environment of a cluster's processes: `base`, then the client settings of
    each service started (None: not started), etcd's with the cluster's root."""
    env = dict(base)
    for svc in (s3, redis, etcd):
        if svc is not None:
            env.update(svc.client_env())
    if etcd is not None:
        env["QUIRE_ETCD_ROOT"] = root
    return env


class LocalCluster:
    """etcd (+ redis, S3, a worker) and `n` coordinators spread over `zones`."""

    def __init__(self, n: int = 3, *, zones: Sequence[str] = ("zone-a", "zone-b"),
                 root: str = "/quire", redis: bool = False, s3: bool = False,
                 worker: bool = False, env: dict[str, str] | None = None,
                 workdir: str | Path | None = None, advertise: dict[int, str] | None = None,
                 ports: dict[int, int] | None = None,
                 prepare: Callable[[int, CoordinatorService], None] | None = None) -> None:
        self.n = n
        self.prepare = prepare
        """Called with each coordinator before it first starts (e.g. its spool on a
        faulty disk: chaos/local_faults.py)."""
        self.zones = list(zones)
        self.root = root
        self.want_redis, self.want_s3, self.want_worker = redis or worker, s3, worker
        self.env = dict(env or {})
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="quire-cluster-"))
        self.advertise = advertise or {}
        self.ports = ports or {}
        self.etcd: EtcdService | None = None
        self.redis: RedisService | None = None
        self.s3: S3Service | None = None
        self.worker: CeleryWorkerService | None = None
        self.coordinators: list[CoordinatorService] = []

    @property
    def endpoints(self) -> list[str]:
        return [c.endpoint for c in self.coordinators]

    def service_env(self) -> dict[str, str]:
        return cluster_env(self.env, self.root, self.s3, self.redis, self.etcd)

    def start(self) -> LocalCluster:
        try:
            self.etcd = EtcdService("etcd", workdir=self.workdir / "etcd").start()
            if self.want_redis:
                self.redis = RedisService("redis", workdir=self.workdir / "redis").start()
            if self.want_s3:
                self.s3 = S3Service("s3", workdir=self.workdir / "s3").start()
            for i in range(self.n):
                zone = self.zones[i % len(self.zones)]
                c = CoordinatorService(
                    f"coord-{i}", zone=zone, suffix=f"coord{i}", etcd_url=self.etcd.url,
                    root=self.root, port=self.ports.get(i), advertise=self.advertise.get(i),
                    redis_url=self.redis.url if self.redis else None, env=self.service_env(),
                    workdir=self.workdir / f"coord-{i}")
                if self.prepare is not None:
                    self.prepare(i, c)
                self.coordinators.append(c)
            for c in self.coordinators:
                c.start(wait=False)
            for c in self.coordinators:
                c.wait_ready()
            if self.want_worker:
                assert self.redis is not None
                self.worker = CeleryWorkerService(
                    "worker", redis_url=self.redis.url, queues=("persist", "index", "pulse"),
                    env=self.service_env(), workdir=self.workdir / "worker").start()
        except BaseException:
            self.close()
            raise
        log.info("cluster.started", coordinators=self.endpoints,
                 etcd=self.etcd.url if self.etcd else None)
        return self

    def close(self) -> None:
        for svc in [self.worker, *reversed(self.coordinators), self.s3, self.redis, self.etcd]:
            if svc is not None:
                try:
                    svc.stop(timeout=5)
                except ServiceError as exc:
                    log.warning("cluster.stop_failed", service=svc.name, error=str(exc))

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
