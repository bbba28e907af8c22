"""A Dask distributed cluster: a scheduler and workers, each a `Service`, on loopback
or each on a simulated host (tools/services/placement.py).

    with DaskCluster(workers=2, hosts=[h0, h1, h2]) as dask:   # scheduler on h0
        client = distributed.Client(dask.scheduler_address)
        read_journals(store, ...).compute()                     # runs on the workers

Processes run this interpreter (`python -m distributed.cli.dask_*`), so workers
import the same packages as the caller (the repository's `spark.dask_reader` among
them; hosts share a disk here). Workers run without a nanny (one process each, so a
kill -9 of a host is a kill of the worker) and one thread each.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Sequence
from typing import Any

from tools.services.placement import LOOPBACK, HeadAndWorkers, Placement, place
from tools.services.process import Service, ServiceError, free_port

__all__ = ["DaskCluster", "DaskSchedulerService", "DaskWorkerService"]


class _DaskProcess(Service):
    ready_timeout = 90.0
    stop_timeout = 15.0

    def __init__(self, name: str, *, where: Placement, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.where = where
        self.host = where.address
        place(self, where)

    def build_env(self) -> dict[str, str]:
        env = super().build_env()
        env.update(PYTHONUNBUFFERED="1", DASK_DISTRIBUTED__WORKER__DAEMON="False",
                   DASK_TEMPORARY_DIRECTORY=str(self.workdir / "tmp"))
        return env


class DaskSchedulerService(_DaskProcess):
    def __init__(self, name: str = "dask-scheduler", *, where: Placement = LOOPBACK,
                 port: int | None = None, **kwargs: Any) -> None:
        super().__init__(name, where=where, **kwargs)
        self.port = port or free_port()

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def describe(self) -> str:
        return self.address

    def build_argv(self) -> list[str]:
        return [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", self.host,
                "--port", str(self.port), "--no-dashboard"]

    def probe(self) -> bool:
        if "Scheduler at:" not in self.log_text():
            return False
        with socket.create_connection((self.host, self.port), timeout=1.0):
            return True


class DaskWorkerService(_DaskProcess):
    def __init__(self, name: str, *, scheduler: DaskSchedulerService,
                 where: Placement = LOOPBACK, port: int | None = None, threads: int = 1,
                 memory_limit: str = "1GB", **kwargs: Any) -> None:
        super().__init__(name, where=where, **kwargs)
        self.scheduler = scheduler
        self.port = port or free_port()
        self.threads, self.memory_limit = threads, memory_limit

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def describe(self) -> str:
        return f"{self.address} -> {self.scheduler.address}"

    def build_argv(self) -> list[str]:
        return [sys.executable, "-m", "distributed.cli.dask_worker", self.scheduler.address,
                "--host", self.host, "--worker-port", str(self.port), "--name", self.name,
                "--nthreads", str(self.threads), "--nworkers", "1", "--no-nanny",
                "--no-dashboard", "--memory-limit", self.memory_limit,
                "--local-directory", str(self.workdir / "local")]

    def probe(self) -> bool:
        # "Registered to: tcp://..." once the scheduler has it.
        return re.search(r"Registered to:\s+tcp://", self.log_text()) is not None


class DaskCluster(HeadAndWorkers[DaskSchedulerService, DaskWorkerService]):
    """A scheduler and `workers` workers. `hosts`: where each runs (scheduler on
    hosts[0], worker i on hosts[1 + i]); default all on loopback."""

    kind = "Dask"
    head_role = "scheduler"

    def __init__(self, workers: int = 2, *, hosts: Sequence[Placement] | None = None,
                 workdir: str | os.PathLike[str] | None = None, threads: int = 1,
                 name: str = "dask") -> None:
        super().__init__(
            workers, hosts, workdir, name,
            lambda where, wd: DaskSchedulerService(f"{name}-scheduler", where=where, workdir=wd),
            lambda i, head, where, wd: DaskWorkerService(
                f"{name}-worker-{i}", scheduler=head, where=where, threads=threads, workdir=wd))

    @property
    def scheduler(self) -> DaskSchedulerService:
        return self.head

    @property
    def scheduler_address(self) -> str:
        return self.head.address
