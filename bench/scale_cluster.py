"""The cluster `bench.scale` measures, and what it reads of its processes.

etcd, redis-server, C coordinators (`python -m coordinator.main`, each with its own
metrics port and a raised `--journal-limit`, as an operator would set it), one Celery
worker (threads x4, every queue) and Celery beat: what `quire up` starts, minus the
dashboard, from tools.services. Every process is a Service in its own process group,
stopped (SIGTERM, then SIGKILL past a bound) by `stop()`, which the bench calls in a
`finally` (Ctrl-C and SIGTERM included); tools.services SIGKILLs any left at exit.

Readings are from /proc (VmRSS, open fds, threads, user+sys CPU), a coordinator's
/metrics (`quire_asyncio_tasks`, `quire_replicas`) and etcdctl (key count, db size).
"""

from __future__ import annotations

import base64
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.cluster_env import ROOT
from tools.local_cluster import hello_probe
from tools.services import CeleryWorkerService, EtcdService, RedisService, Service, ServiceError
from tools.services.process import free_port

__all__ = ["ROOT", "ScaleCluster", "cpu_seconds", "etcd_assignments", "etcd_status",
           "metric_values", "proc_stats", "raise_nofile"]

DRAIN_TIMEOUT = 10.0
"""Each coordinator's `--drain-timeout`: bounds the stop of a cluster of idle journals."""


def raise_nofile() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it):
    a coordinator hosting thousands of replicas holds thousands of fds today."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        new = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft, hard


def proc_stats(pid: int) -> dict[str, float]:
    """VmRSS (KiB), threads and open fds of a process (Linux /proc)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                out["rss_kib"] = int(value.split()[0])
            elif key == "Threads":
                out["threads"] = int(value)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def cpu_seconds(pid: int) -> float:
    """user + sys CPU seconds of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


OTHERS = ("worker", "beat", "etcd", "redis")
"""The cluster's processes besides its coordinators."""


class CpuMeter:
    """CPU seconds each process spent since the meter started: this one ("client"), each
    coordinator ("coordinator i") and the OTHERS by name (a process gone counts as idle)."""

    def __init__(self, cluster: ScaleCluster) -> None:
        self.pids = {"client": os.getpid(),
                     **{f"coordinator {i}": p for i, p in enumerate(cluster.coordinator_pids())},
                     **{k: v for k, v in cluster.pids().items() if k in OTHERS}}
        self.t0 = time.monotonic()
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k, p in self.pids.items():
            try:
                out[k] = cpu_seconds(p)
            except OSError:
                out[k] = -1.0
        return out

    def span(self) -> float:
        """Seconds since the meter started."""
        return time.monotonic() - self.t0

    def used(self) -> dict[str, float]:
        now = self._read()
        gone = -1.0
        return {k: 0.0 if gone in (now[k], self.start[k]) else now[k] - self.start[k]
                for k in now}


def metric_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Unlabelled samples `names` of a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if name in names:
            try:
                out[name] = float(value.split()[0])
            except (ValueError, IndexError):
                pass
    return out


def _etcdctl(url: str, *args: str, timeout: float = 60.0) -> dict:
    out = subprocess.run(["etcdctl", f"--endpoints={url}", "--command-timeout=50s", *args,
                          "-w", "json"], env={**os.environ, "ETCDCTL_API": "3"},
                         capture_output=True, timeout=timeout, check=True)
    return json.loads(out.stdout)


def etcd_status(url: str) -> dict[str, int]:
    """etcd's key count (every key of ours starts with "/") and database size (bytes, and bytes in use)."""
    count = _etcdctl(url, "get", "/", "--prefix", "--limit", "1").get("count", 0)
    status = _etcdctl(url, "endpoint", "status")[0]["Status"]
    return {"etcd_keys": int(count), "etcd_db_bytes": int(status.get("dbSize", 0)),
            "etcd_db_in_use_bytes": int(status.get("dbSizeInUse", 0))}


def etcd_assignments(url: str, root: str = ROOT) -> list[tuple[str, bytes]]:
    """Every assignment key and its value (the advertised route, b"{}" until a pulse)."""
    got = _etcdctl(url, "get", f"{root}/assign/", "--prefix", timeout=120.0)
    return [(base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")))
            for kv in got.get("kvs", [])]


class ScaleCluster:
    """etcd, Redis, `coordinators` coordinators, a Celery worker and beat, in `workdir`."""

    def __init__(self, workdir: Path, *, coordinators: int, journal_limit: int,
                 zones: int = 3, extra_env: dict[str, str] | None = None,
                 lease_ttl: float = 20.0) -> None:
        self.workdir = workdir
        self.lease_ttl = lease_ttl
        """Each coordinator's `--lease-ttl` (the default's): bounds a failover."""
        self.n = coordinators
        self.journal_limit = journal_limit
        self.zones = zones
        self.extra_env = dict(extra_env or {})
        self.store = (workdir / "fragments").as_uri() + "/"
        self.services: list[Service] = []
        self.coordinators: list[Service] = []
        self.metrics_ports: list[int] = []
        self.endpoints: list[str] = []
        self.etcd_url = ""
        self.redis_url = ""

    def env(self) -> dict[str, str]:
        return {"QUIRE_ETCD_URL": self.etcd_url, "QUIRE_ETCD_ROOT": ROOT,
                "QUIRE_REDIS_URL": self.redis_url, "QUIRE_STORE_URL": self.store,
                "QUIRE_DISCOVER": "0", "PYTHONUNBUFFERED": "1", "QUIRE_LOG_LEVEL": "WARNING",
                **self.extra_env}

    def _start(self, svc: Service, wait: bool = True) -> Service:
        self.services.append(svc)
        svc.start(wait=wait)
        return svc

    def start(self) -> ScaleCluster:
        (self.workdir / "fragments").mkdir(parents=True, exist_ok=True)
        try:
            etcd = self._start(EtcdService("etcd", workdir=self.workdir / "etcd"))
            self.etcd_url = etcd.url
            redis = self._start(RedisService("redis", workdir=self.workdir / "redis"))
            self.redis_url = redis.url
            for i in range(self.n):
                port, mport = free_port(), free_port()
                endpoint = f"127.0.0.1:{port}"
                ident = f"coordinator-{i}"
                argv = [sys.executable, "-m", "coordinator.main",
                        "--zone", f"zone-{chr(ord('a') + i % self.zones)}", "--id", ident,
                        "--listen", endpoint, "--etcd", self.etcd_url, "--root", ROOT,
                        "--spool-dir", str(self.workdir / "spool" / ident),
                        "--redis", self.redis_url, "--journal-limit", str(self.journal_limit),
                        "--metrics-port", str(mport), "--drain-timeout", f"{DRAIN_TIMEOUT:g}",
                        "--lease-ttl", f"{self.lease_ttl:g}",
                        "--log-level", "WARNING", "--log-format", "json"]
                svc = Service(ident, argv, env=self.env(), workdir=self.workdir / "logs" / ident,
                              probe=lambda e=endpoint: hello_probe(e), ready_timeout=60,
                              stop_timeout=DRAIN_TIMEOUT + 15)
                self.coordinators.append(svc)
                self.endpoints.append(endpoint)
                self.metrics_ports.append(mport)
                self._start(svc, wait=False)
            for svc in self.coordinators:
                svc.wait_ready()
            self._start(CeleryWorkerService(
                "worker", redis_url=self.redis_url, pool="threads", concurrency=4,
                queues=["celery", "persist", "index", "pulse", "prune", "jobs"],
                loglevel="WARNING", env=self.env(), workdir=self.workdir / "logs" / "worker"))
            beat_dir = self.workdir / "logs" / "beat"
            self._start(Service("beat", [sys.executable, "-m", "celery", "-A", "workers.app",
                                         "beat", "--schedule", str(beat_dir / "schedule"),
                                         "--loglevel", "WARNING"],
                                env=self.env(), workdir=beat_dir), wait=False)
        except BaseException:
            self.stop()
            raise
        return self

    def pids(self) -> dict[str, int]:
        return {svc.name: svc.pid for svc in self.services if svc.pid is not None}

    def coordinator_pids(self) -> list[int]:
        return [svc.pid for svc in self.coordinators if svc.pid is not None]

    def metrics(self, i: int) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.metrics_ports[i]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        return metric_values(text, ("quire_asyncio_tasks", "quire_replicas",
                                    "quire_appends_whole_total", "quire_lane_commits_total",
                                    "quire_log_errors_total"))

    def errors_logged(self) -> dict[str, int]:
        """quire_log_errors_total of each coordinator still running, by name."""
        out: dict[str, int] = {}
        for i, svc in enumerate(self.coordinators):
            if svc.running:
                try:
                    out[svc.name] = int(self.metrics(i).get("quire_log_errors_total", 0))
                except OSError:
                    pass
        return out

    def stop(self) -> float:
        """Stop everything (coordinators at once, then the rest); seconds it took."""
        t0 = time.monotonic()
        errors: list[str] = []

        def stop(svc: Service) -> None:
            try:
                svc.stop()
            except ServiceError as exc:
                errors.append(str(exc))

        if self.coordinators:
            with ThreadPoolExecutor(len(self.coordinators)) as pool:
                list(pool.map(stop, self.coordinators))
        for svc in reversed(self.services):
            if svc not in self.coordinators:
                stop(svc)
        self.services.clear()
        self.coordinators.clear()
        if errors:
            print("; ".join(errors), file=sys.stderr)
        return time.monotonic() - t0
