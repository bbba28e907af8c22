"""Where a service runs: loopback on this machine, or a simulated host.

A `Placement` is anything with an `address` (the IP the service listens on and
advertises) and `argv(argv) -> argv` (how a command is started there). A host of
`tools.hosts.HostHarness` is one (its `adopt(service)` runs the service in its network
namespace and stops it when the harness closes); `LOOPBACK` is the default, so every
launcher here works unchanged on 127.0.0.1.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, Self, TypeVar

from tools.services.process import Service, ServiceError

__all__ = ["LOOPBACK", "HeadAndWorkers", "Loopback", "Placement", "place"]


class Placement(Protocol):
    @property
    def address(self) -> str: ...

    def argv(self, argv: Sequence[str]) -> list[str]: ...


@dataclass(frozen=True)
class Loopback:
    address: str = "127.0.0.1"
    name: str = "loopback"

    def argv(self, argv: Sequence[str]) -> list[str]:
        return list(argv)


LOOPBACK = Loopback()


def place(svc: Service, where: Placement) -> Service:
    """Make `svc` run where `where` is: a host adopts it (its network namespace; kill,
    pause and restart keep working, `ip netns exec` execs the command); loopback leaves
    it as it is. The service itself must listen on `where.address`."""
    adopt = getattr(where, "adopt", None)
    if adopt is not None:
        adopt(svc)
    return svc


H = TypeVar("H", bound=Service)
W = TypeVar("W", bound=Service)


class HeadAndWorkers(Generic[H, W]):
    """A head service (a Spark master, a Dask scheduler) and `workers` workers that join
    it, each on its placement: the head on hosts[0], worker i on hosts[1 + i] (default
    all on loopback). Started head first, workers together; stopped workers first."""

    kind = "service"
    head_role = "head"

    def __init__(self, workers: int, hosts: Sequence[Placement] | None,
                 workdir: str | os.PathLike[str] | None, name: str,
                 make_head: Callable[[Placement, Path], H],
                 make_worker: Callable[[int, H, Placement, Path], W]) -> None:
        places = list(hosts) if hosts else [LOOPBACK] * (workers + 1)
        if len(places) != workers + 1:
            raise ServiceError(f"a {self.kind} cluster of 1 {self.head_role} and {workers} workers "
                               f"needs {workers + 1} placements, got {len(places)}")
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"quire-{name}-"))
        self.head: H = make_head(places[0], self.workdir / self.head_role)
        self.workers: list[W] = [make_worker(i, self.head, places[1 + i],
                                             self.workdir / f"worker-{i}")
                                 for i in range(workers)]

    @property
    def services(self) -> list[Service]:
        return [self.head, *self.workers]

    def start(self) -> Self:
        try:
            self.head.start()
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
        for svc in [*reversed(self.workers), self.head]:
            try:
                svc.stop()
            except ServiceError as exc:
                errors.append(str(exc))
        if errors:
            raise ServiceError("; ".join(errors))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
