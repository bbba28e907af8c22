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
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.services.placement import LOOPBACK, Placement, place
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


class DaskCluster:
    """A scheduler and `workers` workers. `hosts`: where each runs (scheduler on
    hosts[0], worker i on hosts[1 + i]); default all on loopback."""

    def __init__(self, workers: int = 2, *, hosts: Sequence[Placement] | None = None,
                 workdir: str | os.PathLike[str] | None = None, threads: int = 1,
                 name: str = "dask") -> None:
        places = list(hosts) if hosts else [LOOPBACK] * (workers + 1)
        if len(places) != workers + 1:
            raise ServiceError(f"a Dask cluster of 1 scheduler and {workers} workers needs "
                               f"{workers + 1} placements, got {len(places)}")
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"quire-{name}-"))
        self.scheduler = DaskSchedulerService(f"{name}-scheduler", where=places[0],
                                              workdir=self.workdir / "scheduler")
        self.workers = [DaskWorkerService(f"{name}-worker-{i}", scheduler=self.scheduler,
                                          where=places[1 + i], threads=threads,
                                          workdir=self.workdir / f"worker-{i}")
                        for i in range(workers)]

    @property
    def scheduler_address(self) -> str:
        return self.scheduler.address

    @property
    def services(self) -> list[Service]:
        return [self.scheduler, *self.workers]

    def start(self) -> DaskCluster:
        try:
            self.scheduler.start()
            for w in self.workers:
                w.start(wait=False)
            for w in self.workers:
                w.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        errors = []
        for svc in [*reversed(self.workers), self.scheduler]:
            try:
                svc.stop()
            except ServiceError as exc:
                errors.append(str(exc))
        if errors:
            raise ServiceError("; ".join(errors))

    def __enter__(self) -> DaskCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
