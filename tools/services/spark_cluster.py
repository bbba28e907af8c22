"""A Spark standalone cluster: a master and workers, each a `Service`, on loopback or
each on a simulated host (tools/services/placement.py).

    with SparkCluster(workers=2, hosts=[h0, h1, h2]) as spark:   # master on h0
        spark.master_url            # spark://10.x.y.z:7077 -> `quire spark run --master`
        spark.executor_hosts()      # the hosts whose workers ran executors of an app

PySpark ships the launcher (`<pyspark>/bin/spark-class`) and every jar; nothing else is
installed. The master is ready once its web UI's JSON answers ALIVE; a worker once the
master lists it ALIVE at its own host and port. Executors start the driver's Python
(`PYSPARK_PYTHON`, the same path on every host here, since hosts share a disk).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.services.placement import LOOPBACK, HeadAndWorkers, Placement, place
from tools.services.process import Service, ServiceError, free_port, wait_for

__all__ = ["SparkCluster", "SparkMasterService", "SparkWorkerService", "spark_home"]


def spark_home() -> Path:
    """The Spark distribution inside the PySpark package (bin/spark-class, jars/)."""
    try:
        import pyspark
    except ImportError as exc:  # pragma: no cover - pyspark is a dependency
        raise ServiceError("pyspark is not installed") from exc
    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise ServiceError(f"no bin/spark-class in {home}: PySpark without its launcher")
    return home


def _json(url: str, timeout: float = 15.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class _SparkDaemon(Service):
    ready_timeout = 120.0  # a JVM on a loaded machine
    stop_timeout = 15.0

    def __init__(self, name: str, *, where: Placement, port: int | None, webui_port: int | None,
                 daemon_memory: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.where = where
        self.host = where.address
        self.port = port or free_port()
        self.webui_port = webui_port or free_port()
        self.daemon_memory = daemon_memory
        self.conf_dir = self.workdir / "conf"  # empty: no user spark-defaults leak in
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        place(self, where)

    @property
    def webui(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def build_env(self) -> dict[str, str]:
        env = super().build_env()
        for key in [k for k in env if k.startswith(("SPARK_", "PYSPARK_GATEWAY"))]:
            del env[key]
        env.update(SPARK_HOME=str(spark_home()), SPARK_CONF_DIR=str(self.conf_dir),
                   SPARK_LOCAL_IP=self.host, SPARK_LOCAL_DIRS=str(self.workdir / "local"),
                   SPARK_DAEMON_MEMORY=self.daemon_memory, SPARK_LOG_DIR=str(self.workdir))
        return env

    def _spark_class(self, main: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), main, *args]


class SparkMasterService(_SparkDaemon):
    def __init__(self, name: str = "spark-master", *, where: Placement = LOOPBACK,
                 port: int | None = None, webui_port: int | None = None,
                 daemon_memory: str = "256m", **kwargs: Any) -> None:
        super().__init__(name, where=where, port=port, webui_port=webui_port,
                         daemon_memory=daemon_memory, **kwargs)

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def describe(self) -> str:
        return self.url

    def build_argv(self) -> list[str]:
        return self._spark_class("org.apache.spark.deploy.master.Master", "--host", self.host,
                                 "--port", str(self.port), "--webui-port", str(self.webui_port))

    def probe(self) -> bool:
        return _json(self.webui + "/json/", timeout=2.0).get("status") == "ALIVE"

    def state(self) -> dict[str, Any]:
        """The master's view (workers, active and completed applications)."""
        return _json(self.webui + "/json/")


class SparkWorkerService(_SparkDaemon):
    def __init__(self, name: str, *, master: SparkMasterService, where: Placement = LOOPBACK,
                 cores: int = 1, memory: str = "1g", port: int | None = None,
                 webui_port: int | None = None, daemon_memory: str = "256m",
                 **kwargs: Any) -> None:
        super().__init__(name, where=where, port=port, webui_port=webui_port,
                         daemon_memory=daemon_memory, **kwargs)
        self.master = master
        self.cores, self.memory = cores, memory

    def describe(self) -> str:
        return f"{self.host}:{self.port} -> {self.master.url}"

    def build_argv(self) -> list[str]:
        return self._spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", self.host, "--port", str(self.port),
            "--webui-port", str(self.webui_port), "--cores", str(self.cores),
            "--memory", self.memory, "--work-dir", str(self.workdir / "work"), self.master.url)

    def probe(self) -> bool:
        return any(w.get("host") == self.host and int(w.get("port", 0)) == self.port
                   and w.get("state") == "ALIVE" for w in self.master.state().get("workers", []))

    def executors(self) -> list[dict[str, Any]]:
        """Executors this worker ran or runs (its web UI's JSON)."""
        state = _json(self.webui + "/json/")
        return [*state.get("executors", []), *state.get("finishedexecutors", [])]


class SparkCluster(HeadAndWorkers[SparkMasterService, SparkWorkerService]):
    """A master and `workers` workers. `hosts`: where each runs (master on hosts[0],
    worker i on hosts[1 + i]); default all on loopback."""

    kind = "Spark"
    head_role = "master"

    def __init__(self, workers: int = 2, *, hosts: Sequence[Placement] | None = None,
                 workdir: str | os.PathLike[str] | None = None, cores: int = 1,
                 memory: str = "1g", name: str = "spark") -> None:
        super().__init__(
            workers, hosts, workdir, name,
            lambda where, wd: SparkMasterService(f"{name}-master", where=where, workdir=wd),
            lambda i, head, where, wd: SparkWorkerService(
                f"{name}-worker-{i}", master=head, where=where, cores=cores, memory=memory,
                workdir=wd))

    @property
    def master(self) -> SparkMasterService:
        return self.head

    @property
    def master_url(self) -> str:
        return self.head.url

    def driver_conf(self, driver_host: str, *, executor_memory: str = "512m") -> dict[str, str]:
        """Spark conf of a driver outside the cluster at `driver_host` (an address the
        workers reach): one executor of one core per worker."""
        return {"spark.driver.host": driver_host, "spark.driver.bindAddress": driver_host,
                "spark.executor.memory": executor_memory, "spark.executor.cores": "1",
                "spark.cores.max": str(len(self.workers)), "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4"}

    def executor_hosts(self, app_id: str | None = None) -> set[str]:
        """Hosts whose worker ran an executor (of `app_id`, or of any application)."""
        out = set()
        for w in self.workers:
            # A worker's web UI answers slowly on a loaded machine: bounded retries.
            answer = wait_for(lambda w=w: (w.executors(),), timeout=60.0, interval=1.0,
                              what=f"{w.name}'s web UI")
            for ex in answer[0]:
                if app_id is None or ex.get("appid") == app_id:
                    out.add(w.host)
        return out
