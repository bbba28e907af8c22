"""A coordinator proxying an append to a primary whose host is isolated (a silent link:
a connect gets no answer, no RST) neither hangs on its connect nor gives up: it tries
the primary with a short connect timeout, resolves the journal again from its own etcd
watch, and forwards the append to the new primary once one is named — one RPC from the
client's side, answered OK (#31). Nothing of the append reached the old primary before
it was re-routed, so exactly-once is untouched: the content is in the journal once.

Seven hosts: a three-member etcd on three of them (never isolated here), a coordinator
on each of the other four (lease TTL 3 s), a replication-2 journal — so two coordinators
are outside its route and proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from protocol import FragmentSpec, JournalSpec, Status
from protocol.errors import QuireError
from protocol.fragment import Codec
from quire.client import Client
from tests.coordinator.cluster import Conn
from tools.hosts import Host, HostHarness
from tools.services import Service
from tools.services.etcd import EtcdCluster

pytestmark = pytest.mark.timeout(240)

PORT = 8080
JOURNAL = "hosts/proxied"
LEASE_TTL = 3
ZONES = ["e", "e", "e", "a", "b", "c", "d"]


@dataclass
class Cluster:
    h: HostHarness
    etcd: EtcdCluster
    coordinators: dict[str, Service] = field(default_factory=dict)

    @property
    def endpoints(self) -> list[str]:
        return [f"{host.address}:{PORT}" for host in self.h.hosts[3:]]

    def host_at(self, endpoint: str) -> Host:
        host = self.h.host_of(endpoint.rpartition(":")[0])
        assert host is not None, f"{endpoint} is no host of the harness"
        return host


def _listening(address: str) -> bool:
    with socket.create_connection((address, PORT), timeout=1.0):
        return True


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with HostHarness(len(ZONES), zones=ZONES) as h:
        etcd = h.etcd_cluster(h.hosts[:3]).start()
        c = Cluster(h, etcd)  # type: ignore[arg-type]
        for host in h.hosts[3:]:
            argv = [sys.executable, "-m", "coordinator.main", "--zone", host.zone,
                    "--id", f"coord-{host.name}", "--listen", f"{host.address}:{PORT}",
                    "--etcd", etcd.url, "--root", "/quire-proxy",
                    "--spool-dir", str(host.workdir / "spool"),
                    "--lease-ttl", str(LEASE_TTL), "--log-format", "json"]
            c.coordinators[host.name] = host.service(
                f"coordinator-{host.name}", argv, probe=lambda a=host.address: _listening(a))
        for svc in c.coordinators.values():
            svc.start(wait=False)
        for svc in c.coordinators.values():
            svc.wait_ready(60)
        yield c


async def _primary(client: Client) -> tuple[str, tuple[str, ...]]:
    route = (await client.get_journal(JOURNAL)).route
    where = {b.id: b.endpoint for b in await client.list_brokers()}
    members = tuple(where.get(m, "") for m in route.members)
    primary = members[route.primary] if 0 <= route.primary < len(members) else ""
    return primary, members


async def _until(what: str, timeout: float, check):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        with contextlib.suppress(QuireError, OSError, asyncio.TimeoutError):
            last = await check()
            if last:
                return last
        await asyncio.sleep(0.2)  # the cluster's state: polled with a deadline
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


async def test_a_proxied_append_moves_to_the_new_primary_of_an_isolated_ones_journal(
        cluster: Cluster) -> None:
    async with Client(cluster.endpoints, rpc_timeout=5.0) as client:
        await client.apply([JournalSpec(name=JOURNAL, replication=2, fragment=FragmentSpec(
            length=1 << 20, compression_codec=Codec.NONE))])
        await _until("the journal to take appends", 60, lambda: client.append(JOURNAL, b""))

        async def settled() -> tuple[str, tuple[str, ...]] | None:
            primary, members = await _primary(client)
            return (primary, members) if primary and len(members) == 2 and all(members) else None

        old, members = await _until("a primary with two members", 60, settled)
        proxy, reader_at = [e for e in cluster.endpoints if e not in members][:2]
        conn = await Conn.open(proxy)
        warm = await conn.append(JOURNAL, [b"proxied before the isolation\n"])
        assert warm.status == Status.OK, warm
        old_host = cluster.host_at(old)
        data = b"proxied while the primary's host is isolated\n"
        cluster.h.isolate(old_host)
        isolated_at = time.monotonic()
        try:
            # The proxy's route still names the isolated primary (its lease lives up to
            # the TTL): it must find the new one itself. Before the fix it waited out a
            # 5 s connect and answered UNAVAILABLE.
            r = await conn.append(JOURNAL, [data])
            answered = time.monotonic() - isolated_at
            assert r.status == Status.OK, r
            now, _ = await _until("another primary", 30, lambda: settled())
            assert now != old
            print(f"\nproxied append through {proxy} with its primary's host isolated: "
                  f"acknowledged by the new primary {now} after {answered:.1f} s "
                  f"(lease TTL {LEASE_TTL} s)")
        finally:
            await conn.close()
            cluster.h.heal(old_host)
        reader = await Conn.open(reader_at)
        try:
            got, _ = await reader.read(JOURNAL, r.commit.begin, end_offset=r.commit.end)
            assert got == data
            head = await client.write_head(JOURNAL)
            everything, _ = await reader.read(JOURNAL, 0, end_offset=head)
            assert everything.count(data) == 1
        finally:
            await reader.close()
