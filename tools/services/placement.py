"""Where a service runs: loopback on this machine, or a simulated host.

A `Placement` is anything with an `address` (the IP the service listens on and
advertises) and `argv(argv) -> argv` (how a command is started there). A host of
`tools.hosts.HostHarness` is one (its `adopt(service)` runs the service in its network
namespace and stops it when the harness closes); `LOOPBACK` is the default, so every
launcher here works unchanged on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tools.services.process import Service

__all__ = ["LOOPBACK", "Loopback", "Placement", "place"]


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
