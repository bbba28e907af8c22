"""Coordinators on simulated hosts, for the tests of tests/hosts: each listens on and
advertises its own host's address (port 8080) beside a three-member etcd on other
hosts; and the two questions those tests keep asking of it — where is a journal's
primary, and has the cluster reached a state yet (polled with a deadline)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol.errors import QuireError
from quire.client import Client
from tools.hosts import Host, HostHarness
from tools.services import RedisService, Service
from tools.services.etcd import EtcdCluster

PORT = 8080


@dataclass
class HostsCluster:
    h: HostHarness
    etcd: EtcdCluster
    hosts: list[Host]
    """The hosts that run a coordinator."""
    redis: RedisService | None = None
    coordinators: dict[str, Service] = field(default_factory=dict)

    @property
    def endpoints(self) -> list[str]:
        return [f"{host.address}:{PORT}" for host in self.hosts]

    def host_at(self, endpoint: str) -> Host:
        host = self.h.host_of(endpoint.rpartition(":")[0])
        assert host is not None, f"{endpoint} is no host of the harness"
        return host


def _listening(address: str) -> bool:
    with socket.create_connection((address, PORT), timeout=1.0):
        return True


def start_coordinators(h: HostHarness, etcd: EtcdCluster, hosts: Sequence[Host], *, root: str,
                       lease_ttl: int, redis: RedisService | None = None) -> HostsCluster:
    """A coordinator on each of `hosts` (zone = the host's), started together and
    waited for; the harness stops them with itself."""
    c = HostsCluster(h, etcd, list(hosts), redis)
    for host in hosts:
        argv = [sys.executable, "-m", "coordinator.main", "--zone", host.zone,
                "--id", f"coord-{host.name}", "--listen", f"{host.address}:{PORT}",
                "--etcd", etcd.url, "--root", root,
                *(["--redis", redis.url] if redis is not None else []),
                "--spool-dir", str(host.workdir / "spool"),
                "--lease-ttl", str(lease_ttl), "--log-format", "json"]
        c.coordinators[host.name] = host.service(
            f"coordinator-{host.name}", argv, probe=lambda a=host.address: _listening(a))
    for svc in c.coordinators.values():
        svc.start(wait=False)
    for svc in c.coordinators.values():
        svc.wait_ready(60)
    return c


async def primary_of(client: Client, journal: str) -> tuple[str, tuple[str, ...]]:
    """The journal's primary endpoint and its members' endpoints, as etcd has them."""
    route = (await client.get_journal(journal)).route
    where = {b.id: b.endpoint for b in await client.list_brokers()}
    members = tuple(where.get(m, "") for m in route.members)
    primary = members[route.primary] if 0 <= route.primary < len(members) else ""
    return primary, members


class NotYet(str):
    """A falsy answer of a `check` that says what it saw (`until` names the last one)."""

    def __bool__(self) -> bool:
        return False


async def until(what: str, timeout: float, check):  # noqa: ANN001, ANN201
    """Await `check()` until it is truthy (errors of an unsettled cluster count as not
    yet) and return it; fail naming `what` and the last answer after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        with contextlib.suppress(QuireError, OSError, asyncio.TimeoutError):
            last = await check()
            if last:
                return last
        await asyncio.sleep(0.2)  # the cluster's state: polled with a deadline
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
