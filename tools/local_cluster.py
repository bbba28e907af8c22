"""`quire up`: a whole quire cluster on this machine, as real subprocesses.

etcd (from PATH), redis-server, N coordinators (`python -m coordinator.main`), a Celery
worker, Celery beat, the live dashboard (`python -m dashboards.main`), and Flower on
request; fragments go to `file://<data-dir>/fragments/` unless another store is given. Roles are started as processes and never imported, and
only roles whose code exists are started (a missing workers package is reported, not
faked).

The data directory is reused across runs: etcd keeps its data (journals survive), the
ports chosen the first time are remembered in `cluster.json` (etcd's data records its
peer URL), and every coordinator keeps its id and spool directory.

Stopping drains first: every coordinator gets SIGTERM at once (each rolls the spools it
leads and waits, at most DRAIN_TIMEOUT, for the still-running workers to persist them),
then the worker, beat, the dashboard and Flower together, then Redis and etcd. Each
phase has its bound (STOP_BOUND in all); a member still running at the end of its
phase is SIGKILLed, and what each coordinator's drain left on disk is said. A second
run then reads everything and appends on where the first one stopped.

Every member dies with the process that started it, even on SIGKILL (tools/lifetime.py),
and the data dir's run record (tools/cluster_run.py) lets the next run in the same data
dir reap anything that survived anyway, and refuses a second run while one is alive.

`quire up` itself (printing, supervising restarts, signals) is tools/supervisor.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.cluster_env import ROOT, ClusterEnv
from tools.cluster_run import RunDir
from tools.cluster_stop import stop_phase
from tools.services import CeleryWorkerService, EtcdService, RedisService, Service, ServiceError
from tools.services.process import free_port

DRAIN_TIMEOUT = 30.0
"""`--drain-timeout` of each coordinator: the most a stop waits for its drain."""
COORDINATOR_GRACE = 5.0
"""Beyond its drain, what a coordinator gets to exit before it is SIGKILLed."""
MEMBER_STOP = 15.0
"""The worker (its warm shutdown), beat, the dashboard and Flower, together."""
STORE_STOP = 10.0
"""Redis and etcd, together, last."""
STOP_BOUND = DRAIN_TIMEOUT + COORDINATOR_GRACE + MEMBER_STOP + STORE_STOP
"""The most a stop takes before every member is gone (docs/operations.md), a moment
for SIGKILLed members to be reaped aside."""


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # As servers bind: a port whose old connections linger in TIME_WAIT is free to
        # them, and must be to us, or every restart would move the cluster.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def hello_probe(endpoint: str, timeout: float = 1.0, ssl: Any = None, token: str = "") -> bool:
    """True once a quire coordinator answers Hello at `endpoint` (blocking, no asyncio);
    `ssl`: a client SSLContext for coordinators serving TLS; `token` when auth is on."""
    from protocol import Hello, HelloAck
    from protocol.wire import FrameDecoder, encode_frame_bytes

    host, _, port = endpoint.rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=timeout)
    with (ssl.wrap_socket(raw, server_hostname=host) if ssl is not None else raw) as sock:
        sock.sendall(encode_frame_bytes(Hello(token=token)))
        decoder = FrameDecoder()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                return False
            decoder.feed(data)
            for frame in decoder.frames():
                return isinstance(frame.message, HelloAck)
    return False


def _package_dir(name: str) -> Path | None:
    # find_spec of a top-level package locates it without importing it.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


class LocalCluster(ClusterEnv):
    def __init__(self, data_dir: str | Path, *, coordinators: int = 1, store: str | None = None,
                 flower: bool = False, zones: int = 1, port: int = 8080, tls: bool = False,
                 auth: bool = False, secure: bool = False) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.say: Callable[[str], None] = lambda text: None
        """Where the stop reports its progress (`quire up` prints it)."""
        self._hurry = threading.Event()
        self.up = False
        """True from the moment its env file is written (clients find it) until stop()."""
        self.run = RunDir(self.data_dir)
        self.run.acquire()  # AlreadyRunning if a live quire up has this data dir
        try:
            self.reaped = self.run.reap()  # before the ports: a leftover may hold them
            self._init(coordinators, store, flower, zones, port, tls, auth, secure)
        except BaseException:
            self.run.release()
            raise

    def _init(self, coordinators: int, store: str | None, flower: bool, zones: int, port: int,
              tls: bool, auth: bool, secure: bool) -> None:
        self.n = coordinators
        self.zones = zones
        self.store = store or (self.data_dir / "fragments").as_uri() + "/"
        if self.store.startswith("file://"):
            Path(self.store[len("file://"):]).mkdir(parents=True, exist_ok=True)
        self.want_flower = flower
        self.services: list[Service] = []
        self.notes: list[str] = []
        self.ports = self._ports(port)
        self.coordinators: list[Service] = []
        self.flower_url = ""
        self.dashboard_url = ""
        self.tls = None
        tls = tls or secure
        auth = auth or secure
        self.secure = None  # --secure: tools/secure_cluster.py
        if tls:  # a local CA and one certificate; every process finds them in env()
            from tools.tls_certs import make_local_ca

            self.tls = make_local_ca(self.data_dir / "tls")
        self.keys_file = ""
        self.service_token = self.admin_token = ""
        if auth:
            self._make_auth()
        if secure:
            from tools.secure_cluster import prepare

            assert self.tls is not None
            self.secure = prepare(self.data_dir, self.tls)

    # -- layout ---------------------------------------------------------------------

    def _ports(self, first: int) -> dict[str, Any]:
        path = self.data_dir / "cluster.json"
        saved: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        ports: dict[str, Any] = {}

        def pick(key: str, preferred: int | None) -> int:
            for candidate in (saved.get(key), preferred):
                if candidate and _port_free(candidate):
                    return int(candidate)
            return free_port()

        ports["etcd_client"] = pick("etcd_client", None)
        # The peer port is baked into etcd's data: keep it even if we must wait for it.
        ports["etcd_peer"] = saved.get("etcd_peer") or free_port()
        ports["redis"] = pick("redis", None)
        ports["flower"] = pick("flower", None)
        ports["dashboard"] = pick("dashboard", None)
        ports["worker_metrics"] = pick("worker_metrics", None)
        ports["coordinators"] = []
        for i in range(self.n):
            prev = (saved.get("coordinators") or [])
            ports["coordinators"].append(pick(f"c{i}", prev[i] if i < len(prev) else first + i))
        path.write_text(json.dumps({**saved, **ports,
                                    **{f"c{i}": p for i, p in enumerate(ports["coordinators"])}}))
        return ports

    @property
    def etcd_url(self) -> str:
        scheme = "https" if self.secure is not None else "http"
        return f"{scheme}://127.0.0.1:{self.ports['etcd_client']}"

    @property
    def redis_url(self) -> str:
        """The operator's Redis URL (with --secure: the `quire-beat` ACL user)."""
        return self.redis_url_for("beat")

    def redis_url_for(self, role: str) -> str:
        """The Redis URL a role uses: with --secure its own ACL user over TLS."""
        if self.secure is not None:
            from tools.secure_cluster import redis_url

            return redis_url(self.secure, self.ports["redis"], role)
        return f"redis://127.0.0.1:{self.ports['redis']}/0"

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports["coordinators"]]

    # -- lifecycle ------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """ClusterEnv.env() and this run's token (tools/cluster_run.py: what lets the
        next run tell a leftover of this one from a stranger)."""
        return {**super().env(), "QUIRE_UP_RUN": self.run.token}

    def _spawned(self, svc: Service) -> None:
        self.run.record({s.name: s.identity for s in self.services
                         if s.identity is not None and s.running})

    def _start(self, svc: Service) -> Service:
        self.services.append(svc)
        svc.on_spawn = self._spawned
        svc.start()
        return svc

    def start(self) -> LocalCluster:
        if not self.run.held:  # started again after a stop
            self.run.acquire()
            self.reaped = self.run.reap()
        self._hurry.clear()
        try:
            self.run.set_state("starting")
            sec = self.secure
            self._start(EtcdService("etcd", client_port=self.ports["etcd_client"],
                                    peer_port=self.ports["etcd_peer"],
                                    workdir=self.data_dir / "etcd",
                                    tls=sec.ca if sec else None,
                                    probe_cert=sec.etcd_root if sec else None))
            if sec is not None:
                from tools.secure_cluster import bootstrap_etcd

                bootstrap_etcd(self.etcd_url, sec, ROOT)
            self._start(RedisService("redis", port=self.ports["redis"], appendonly=True,
                                     workdir=self.data_dir / "redis",
                                     tls=sec.ca if sec else None,
                                     aclfile=sec.aclfile if sec else None,
                                     probe_user=("quire-worker", sec.redis_passwords["worker"])
                                     if sec else None))
            self._start_coordinators()
            self._start_workers()
            self._start_dashboard()
            self._write_env_file()
            self.run.set_state("up")
            self.up = True
        except BaseException:
            self.stop()
            raise
        return self

    def _start_coordinators(self) -> None:
        if _package_dir("coordinator") is None:
            self.notes.append("coordinator package not installed: no coordinators started")
            return
        pending = []
        for i, port in enumerate(self.ports["coordinators"]):
            zone = f"zone-{chr(ord('a') + i % self.zones)}" if self.zones > 1 else "local"
            ident = f"coordinator-{i}"
            endpoint = f"127.0.0.1:{port}"
            argv = [sys.executable, "-m", "coordinator.main", "--zone", zone, "--id", ident,
                    "--listen", endpoint, "--etcd", self.etcd_url, "--root", ROOT,
                    "--spool-dir", str(self.data_dir / "spool" / ident),
                    "--redis", self.redis_url_for("coordinator"),
                    "--drain-timeout", f"{DRAIN_TIMEOUT:g}"]
            ctx = None
            if self.tls is not None:
                from protocol.tls import client_context

                ctx = client_context(self.tls.ca, self.tls.cert, self.tls.key)
            svc = Service(ident, argv, env=self.role_env("coordinator"),
                          workdir=self.data_dir / "logs" / ident,
                          probe=lambda e=endpoint, c=ctx: hello_probe(e, ssl=c, token=self.service_token),
                          ready_timeout=60,
                          stop_timeout=DRAIN_TIMEOUT + 15)  # SIGKILL only past its drain
            svc.endpoint = endpoint  # type: ignore[attr-defined]
            svc.describe = lambda e=endpoint, z=zone: f"{e} (zone {z})"  # type: ignore[method-assign]
            self.services.append(svc)
            self.coordinators.append(svc)
            svc.on_spawn = self._spawned
            svc.start(wait=False)
            pending.append(svc)
        for svc in pending:  # start in parallel, then wait for each
            svc.wait_ready()

    def _start_workers(self) -> None:
        workers = _package_dir("workers")
        if workers is None or not (workers / "app.py").exists():
            self.notes.append("workers package not found: no Celery worker, beat or Flower "
                              "(fragments stay on coordinator disks)")
            return
        queues = ["celery"] + [q for q in ("persist", "index", "pulse", "prune", "jobs") if (workers / f"{q}.py").exists()]
        env = self.role_env("worker")
        if self.secure is not None:  # the refusal counter must be readable: loopback only
            env["QUIRE_WORKER_METRICS_PORT"] = str(self.ports["worker_metrics"])
        self._start(CeleryWorkerService("worker", redis_url=self.redis_url_for("worker"), queues=queues,
                                        pool="threads", concurrency=4, env=env,
                                        workdir=self.data_dir / "logs" / "worker"))
        if "beat_schedule" in (workers / "app.py").read_text():
            beat_dir = self.data_dir / "logs" / "beat"
            beat_dir.mkdir(parents=True, exist_ok=True)
            beat = Service("beat", [sys.executable, "-m", "celery", "-A", "workers.app", "beat",
                                    "--schedule", str(beat_dir / "schedule"), "--loglevel", "INFO"],
                           env=self.role_env("beat"), workdir=beat_dir)
            beat.describe = lambda: "celery beat (index & pulse sweeps)"  # type: ignore[method-assign]
            self._start(beat)
        else:
            self.notes.append("workers.app has no beat_schedule: celery beat not started")
        if self.want_flower:
            port = self.ports["flower"]
            self.flower_url = f"http://127.0.0.1:{port}/"
            flower = Service("flower", [sys.executable, "-m", "celery", "-A", "workers.app",
                                        "flower", f"--port={port}", "--address=127.0.0.1"],
                             env=env, workdir=self.data_dir / "logs" / "flower",
                             probe=lambda: _http_ok(self.flower_url), ready_timeout=60)
            flower.describe = lambda: self.flower_url  # type: ignore[method-assign]
            self._start(flower)

    def _start_dashboard(self) -> None:
        if _package_dir("dashboards") is None:
            self.notes.append("dashboards package not found: no live dashboard")
            return
        port = self.ports["dashboard"]
        ctx = None
        if self.tls is not None:  # the dashboard serves HTTPS with the cluster's certificate
            from protocol.tls import client_context

            ctx = client_context(self.tls.ca)
        self.dashboard_url = f"{'https' if ctx else 'http'}://127.0.0.1:{port}/"
        dash = Service("dashboard", [sys.executable, "-m", "dashboards.main", "--etcd", self.etcd_url,
                                     "--root", ROOT, "--listen", f"127.0.0.1:{port}"],
                       env=self.role_env("coordinator"), workdir=self.data_dir / "logs" / "dashboard",
                       probe=lambda: _http_ok(self.dashboard_url, ctx), ready_timeout=60)
        dash.describe = lambda: self.dashboard_url  # type: ignore[method-assign]
        self._start(dash)

    def hurry(self) -> None:
        """Cut the stop short: every member still running is SIGKILLed now (a second
        Ctrl-C or SIGTERM to `quire up`)."""
        self._hurry.set()

    def stop(self) -> None:
        """Coordinators first, all at once (each drains while the workers still persist),
        then the worker, beat, dashboard and Flower, then Redis and etcd; each phase
        bounded (STOP_BOUND in all), a member past its phase's bound SIGKILLed."""
        self._remove_env_file()  # first: from now on no command should find this cluster
        self.up = False
        errors: list[str] = []
        if any(s.pid is not None for s in self.services):
            self.say(f"stopping… (at most {STOP_BOUND:g}s: coordinators drain first, up to "
                     f"{DRAIN_TIMEOUT:g}s; Ctrl-C again kills every member now)")
        if self.run.held:
            self.run.set_state("stopping")
        try:
            coordinators = [s for s in self.coordinators if s in self.services]
            stores = [s for s in self.services if isinstance(s, (EtcdService, RedisService))]
            rest = [s for s in reversed(self.services) if s not in coordinators and s not in stores]
            spools = {s.name: self.data_dir / "spool" / s.name for s in coordinators}
            stop_phase(coordinators, DRAIN_TIMEOUT + COORDINATOR_GRACE, self.say, self._hurry,
                       errors, "draining: in-flight appends, rolling spools, their persistence",
                       spools)
            stop_phase(rest, MEMBER_STOP, self.say, self._hurry, errors)
            stop_phase(list(reversed(stores)), STORE_STOP, self.say, self._hurry, errors)
        finally:
            self.services.clear()
            self.coordinators.clear()
            self.run.release()
        if errors:
            raise ServiceError("; ".join(errors))

    def dead(self) -> list[Service]:
        return [s for s in self.services if not s.running]

    def rows(self) -> list[dict[str, Any]]:
        return [{"service": s.name, "pid": s.pid, "address": s.describe(),
                 "log": str(s.log_path)} for s in self.services]

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_ok(url: str, ctx: Any = None) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=1.0, context=ctx) as resp:
        return resp.status < 500
