"""A quire cluster across five hosts (netns, tools.hosts) with a three-member etcd.

Coordinators listen on and advertise their host's address (never loopback or a
wildcard), zones are hosts so a replication-3 journal spans at least two zones (as
Gazette's allocator: two zones survive a zone's loss), and: kill -9 the etcd member the
primary's coordinator talks to — appends keep succeeding without a pause over 2 s;
isolate the primary's host — another host's coordinator takes the journal and appends
succeed; heal — the old primary's coordinator is a member of the cluster again, the
journal keeps its full route (placement is sticky: nothing moves back) and every
acknowledged append is in the journal at its offsets. And an append in flight when its
primary's host is isolated is answered within the lease TTL + 2 s (plus a margin for
load), though its socket is silent and its RPC timeout a minute away.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import FragmentSpec, JournalSpec, Status
from protocol.errors import CommitUnknown, QuireError
from protocol.fragment import Codec
from quire.client import Client, Producer
from tests.coordinator.cluster import Conn
from tests.hosts.hosts_cluster import (HostsCluster, NotYet, primary_of, start_coordinators,
                                      until)
from tools.hosts import HostHarness
from tools.services import CeleryWorkerService, RedisService, wait_for

JOURNAL = "hosts/events"
ZONES = ["a", "a", "b", "c", "c"]
LEASE_TTL = 3
LOAD_MARGIN = 6.0
"""Seconds beyond the lease TTL + 2 s an answer may take on a loaded shared machine
(the test waits with this bound; the figure itself is printed)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[HostsCluster]:
    with HostHarness(5, zones=ZONES) as h:
        etcd = h.etcd_cluster(h.hosts[:3]).start()
        redis = h.hosts[3].adopt(RedisService("redis", port=6379, listen_host=h.hosts[3].address,
                                              workdir=h.hosts[3].workdir / "redis"))
        redis.start()
        yield start_coordinators(h, etcd, h.hosts, root="/quire-hosts", lease_ttl=LEASE_TTL,
                                 redis=redis)


async def _primary(client: Client) -> tuple[str, tuple[str, ...]]:
    return await primary_of(client, JOURNAL)


class Appender:
    """Appends unique records continuously; keeps every acknowledged one and when."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.acked: list[tuple[int, int, bytes, float]] = []
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        seq = 0
        while True:
            seq += 1
            data = f"record {seq:08d} {'x' * 64}\n".encode()
            try:
                r = await self.client.append(JOURNAL, data, retry_timeout=4.0)
            except QuireError:
                self.failures += 1  # definite or indefinite: not acknowledged
            else:
                self.acked.append((r.begin, r.end, data, time.monotonic()))
            await asyncio.sleep(0.02)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def acks_after(self, t: float) -> int:
        return sum(1 for *_, at in self.acked if at > t)

    def longest_pause(self, since: float, until: float) -> float:
        times = [since] + [at for *_, at in self.acked if since < at < until] + [until]
        return max(b - a for a, b in zip(times, times[1:]))


async def test_advertised_addresses_and_zone_spreading(cluster: HostsCluster) -> None:
    async with Client(cluster.endpoints, rpc_timeout=5.0) as client:
        await client.apply([JournalSpec(name=JOURNAL, replication=3, fragment=FragmentSpec(
            length=1 << 20, compression_codec=Codec.NONE))])
        await until("the journal to take appends", 60, lambda: client.append(JOURNAL, b""))
        async def all_members() -> list:  # type: ignore[type-arg]
            brokers = await client.list_brokers()
            return brokers if len(brokers) == len(cluster.endpoints) else []

        brokers = await until("every coordinator to be a member", 30, all_members)
        assert sorted(b.endpoint for b in brokers) == sorted(cluster.endpoints)
        for b in brokers:
            host = ipaddress.ip_address(b.endpoint.rpartition(":")[0])
            assert not (host.is_loopback or host.is_unspecified), b
            assert cluster.host_at(b.endpoint).zone == b.id.zone
        # The dashboard on its own host finds the coordinators through etcd and links
        # them by their advertised addresses.
        dash_host = cluster.h.hosts[3]
        dash_url = f"http://{dash_host.address}:8090"
        dash = dash_host.service("dashboard", [
            sys.executable, "-m", "dashboards.main", "--etcd", cluster.etcd.url,
            "--root", "/quire-hosts", "--listen", f"{dash_host.address}:8090"],
            probe=lambda: urllib.request.urlopen(f"{dash_url}/healthz", timeout=1).status == 200)
        dash.start()
        try:
            def state_names_every_coordinator() -> str:
                with urllib.request.urlopen(f"{dash_url}/api/state", timeout=5) as resp:
                    text = resp.read().decode()
                return text if all(e in text for e in cluster.endpoints) else ""

            text = await asyncio.to_thread(
                wait_for, state_names_every_coordinator, timeout=30, what="the dashboard's state")
            assert "127.0.0.1" not in text and "0.0.0.0" not in text
        finally:
            dash.stop()
        # `quire brokers list` from another host, through one coordinator.
        quire = str(Path(sys.executable).parent / "quire")
        out = cluster.h.hosts[4].run([quire, "--broker", cluster.endpoints[0], "brokers",
                                      "list", "-o", "json"]).stdout
        assert sorted(json.loads(line)["endpoint"] for line in out.splitlines()) \
            == sorted(cluster.endpoints)
        for member in cluster.etcd.members:  # etcd advertises host addresses too
            listed = member._gateway("cluster/member/list", {})["members"]  # noqa: SLF001
            for url in (u for m in listed for u in m["clientURLs"] + m["peerURLs"]):
                assert cluster.h.host_of(url.split("//")[1].rpartition(":")[0]), url
        route = (await client.get_journal(JOURNAL)).route
        assert len(route.members) == 3
        assert len({m.zone for m in route.members}) >= 2, route
        primary, members = await _primary(client)
        assert sorted(cluster.host_at(e).zone for e in members) == sorted(m.zone for m in route.members)
        # An append sent to a coordinator that is not the primary is proxied to it across
        # hosts, and a read from yet another one returns it.
        other = next(e for e in cluster.endpoints if e != primary)
        conn = await Conn.open(other)
        try:
            r = await conn.append(JOURNAL, [b"proxied across hosts\n"])
            assert r.status == Status.OK, r
        finally:
            await conn.close()
        reader = await Conn.open(next(e for e in cluster.endpoints if e not in (primary, other)))
        try:
            data, _ = await reader.read(JOURNAL, r.commit.begin, end_offset=r.commit.end)
            assert data == b"proxied across hosts\n"
        finally:
            await reader.close()


async def test_persist_workers_fetch_fragments_across_hosts(cluster: HostsCluster, tmp_path) -> None:  # noqa: ANN001
    """A persist worker on its own host fetches closed fragments from the coordinators
    at their advertised addresses and writes them to the store."""
    store = tmp_path / "store"
    store.mkdir()
    worker_host = cluster.h.hosts[4]
    worker = worker_host.adopt(CeleryWorkerService(
        "worker", redis_url=cluster.redis.url, queues=("persist", "index", "pulse"),
        env={"QUIRE_ETCD_URL": cluster.etcd.url, "QUIRE_ETCD_ROOT": "/quire-hosts"},
        workdir=worker_host.workdir / "worker"))
    worker.start()
    name = "hosts/persisted"
    async with Client(cluster.endpoints, rpc_timeout=5.0) as client:
        await client.apply([JournalSpec(name=name, replication=3, fragment=FragmentSpec(
            length=1024, compression_codec=Codec.NONE, stores=(store.as_uri() + "/",),
            refresh_interval=1.0))])
        await until("the journal to take appends", 60, lambda: client.append(name, b""))
        first = await client.append(name, b"a" * 3000)
        await client.append(name, b"b" * 10)  # rolls the first fragment (3000 > 1024)

        async def persisted() -> bool:
            infos = await client.list_fragments(name)
            return any(i.spec.begin == first.begin and i.spec.end == first.end and not i.local
                       for i in infos)

        await until("the first fragment to be persisted by the worker", 90, persisted)
        files = [p for p in store.rglob("*") if p.is_file()]
        assert any(p.stat().st_size == 3000 for p in files), files
    worker.stop()


async def test_etcd_member_loss_then_primary_host_isolation(cluster: HostsCluster) -> None:
    async with Client(cluster.endpoints, rpc_timeout=2.0, connect_timeout=1.0) as client:
        await until("the journal to take appends", 60, lambda: client.append(JOURNAL, b""))
        appender = Appender(client)
        appender.start()
        try:
            await until("appends", 20, lambda: _true(appender.acks_after(0) >= 20))
            await _etcd_member_loss(cluster, client, appender)
            await _isolate_primary_host(cluster, client, appender)
            await _lose_etcd_quorum(cluster, client, appender)
        finally:
            await appender.stop()
        await _check_every_ack(client, appender)


async def _true(value: bool) -> bool:
    return value


async def _etcd_member_loss(cluster: HostsCluster, client: Client, appender: Appender) -> None:
    primary, _ = await _primary(client)
    host = cluster.host_at(primary)
    # The member the primary's coordinator holds a connection to (its client port): the
    # coordinator's own sockets, not those of other processes on its host (etcd clients
    # start at a random member, so a worker beside it may use another).
    pid = cluster.coordinators[host.name].pid
    sockets = host.run(["ss", "-Htnp", "state", "established"]).stdout.splitlines()
    peers = {word for line in sockets if f"pid={pid}," in line for word in line.split()}
    # (an IPv4 peer of a dual-stack socket shows as [::ffff:a.b.c.d]:port)
    victim = next((m for m in cluster.etcd.members
                   if {f"{m.host}:{m.client_port}", f"[::ffff:{m.host}]:{m.client_port}"} & peers),
                  None)
    assert victim is not None, f"no etcd connection from coordinator pid {pid}: {sockets}"
    killed_at = time.monotonic()
    victim.kill()
    try:
        await asyncio.sleep(6.0)  # two lease TTLs: keep-alives must have moved on
        now = time.monotonic()
        pause = appender.longest_pause(killed_at, now)
        assert appender.acks_after(killed_at) > 20
        print(f"\netcd member {victim.name} killed: longest pause between acknowledged "
              f"appends {pause:.2f} s")
        assert pause <= 2.0, f"appends paused {pause:.2f} s after etcd member {victim.name} died"
        assert (await _primary(client))[0] == primary, "losing one etcd member moved the primary"
    finally:
        victim.start()  # back with its data: three members again


async def _isolate_primary_host(cluster: HostsCluster, client: Client, appender: Appender) -> None:
    old, _ = await _primary(client)
    old_host = cluster.host_at(old)
    cluster.h.isolate(old_host)
    isolated_at = time.monotonic()
    try:
        async def moved() -> bool:
            primary, _ = await _primary(client)
            return bool(primary) and primary != old and appender.acks_after(isolated_at) > 0 \
                and any(at > isolated_at and cluster.host_at(primary) for *_, at in appender.acked)

        await until("another host's coordinator to take the journal", 40, moved)
        taken = time.monotonic() - isolated_at
        gap = appender.longest_pause(isolated_at, time.monotonic())
        print(f"\nisolating the primary's host: new primary after {taken:.1f} s, appends "
              f"paused {gap:.1f} s at most (lease TTL {LEASE_TTL} s)")
        before = len(appender.acked)
        await until("appends through the new primary", 20,
                     lambda: _true(len(appender.acked) >= before + 20))
    finally:
        cluster.h.heal(old_host)
        healed_at = time.monotonic()

    async def rejoined() -> bool | NotYet:
        brokers = {b.endpoint for b in await client.list_brokers()}
        primary, members = await _primary(client)
        return (old in brokers and bool(primary) and len(members) == 3) or \
            NotYet(f"brokers {sorted(brokers)}, primary {primary}, members {members}")

    # The old primary's coordinator re-announces (waiting out its old key, up to TTL +
    # 5 s) and the journal keeps a full route. Placement is sticky, so the journal moves
    # back to it only if it was placed afresh without its stand-ins (e.g. every lease
    # lapsed together while etcd failed over): then the allocator hands it to the
    # best-ranked member that took part in the last advertised sync, which may be the old
    # primary. `_check_every_ack` checks no acknowledged append was lost either way.
    await until("the old primary's coordinator back in the cluster and the route full",
                90, rejoined)
    # Printed so a slow rejoin (one CI timeout beside a chaos campaign) can be told from
    # a stuck one.
    primary, members = await _primary(client)
    role = "the primary again" if primary == old else "a replica" if old in members \
        else "a member of the cluster, not of this route (sticky placement)"
    print(f"\nold primary {old} is {role} {time.monotonic() - healed_at:.1f} s after the heal")
    before = len(appender.acked)
    await until("appends after the heal", 20, lambda: _true(len(appender.acked) >= before + 20))


async def _lose_etcd_quorum(cluster: HostsCluster, client: Client, appender: Appender) -> None:
    """Two of three etcd members down for over two lease TTLs, then back: appends
    resume by themselves (no coordinator restarted), and the final check finds no
    acknowledged append lost or overwritten (two primaries would have overwritten)."""
    down = cluster.etcd.members[1:]
    for member in down:
        member.kill()
    lost_at = time.monotonic()
    try:
        await asyncio.sleep(2 * LEASE_TTL + 2)
    finally:
        for member in down:
            member.start(wait=False)
        for member in down:
            member.wait_ready(60)
    back_at = time.monotonic()
    during = appender.acks_after(lost_at) - appender.acks_after(back_at)
    await until("appends after etcd's quorum came back", 60,
                 lambda: _true(appender.acks_after(back_at) >= 20))
    resumed = min(at for *_, at in appender.acked if at > back_at) - back_at
    print(f"\netcd quorum lost for {back_at - lost_at:.1f} s: {during} appends acknowledged "
          f"meanwhile; appends resumed {resumed:.1f} s after quorum returned")


async def _check_every_ack(client: Client, appender: Appender) -> None:
    head = max(end for _, end, _, _ in appender.acked)
    content = bytearray()
    async for offset, data in client.read(JOURNAL, 0, end_offset=head):
        assert offset == len(content), (offset, len(content))
        content += data
        if len(content) >= head:
            break
    ranges = sorted((b, e) for b, e, _, _ in appender.acked)
    overlaps = [(x, y) for x, y in zip(ranges, ranges[1:]) if y[0] < x[1]]
    assert not overlaps, f"acknowledged appends at overlapping offsets: {overlaps[:5]}"
    missing = [(b, e) for b, e, data, _ in appender.acked if bytes(content[b:e]) != data]
    assert not missing, f"{len(missing)} acknowledged appends missing or different: {missing[:5]}"


async def test_append_in_flight_across_primary_isolation(cluster: HostsCluster, tmp_path) -> None:  # noqa: ANN001
    """An append whose stream the primary has begun when its host is isolated (the
    commit then sent into the cut link: no RST, a silent socket) gets an answer, and an
    identified append sent to it meanwhile is acknowledged by the new primary, within
    the lease TTL + 2 s — the client stops waiting once the journal has moved
    (quire/client/reroute.py), not at its RPC timeout (60 s here)."""
    bound = LEASE_TTL + 2.0 + LOAD_MARGIN
    async with Client(cluster.endpoints, connect_timeout=1.0) as client:
        await client.apply([JournalSpec(name=JOURNAL, replication=3, fragment=FragmentSpec(
            length=1 << 20, compression_codec=Codec.NONE))])  # (the same spec: runs alone too)
        async def settled() -> tuple[str, tuple[str, ...]] | None:
            primary, members = await _primary(client)
            return (primary, members) if primary and len(members) == 3 and all(members) else None

        old, _ = await until("a primary with three members", 60, settled)
        # The route cached, then two pooled connections to the primary, so both appends
        # below go straight to it.
        await client.append(JOURNAL, b"warm\n")
        await asyncio.gather(*(client.append(JOURNAL, b"warm\n") for _ in range(2)))
        assert client.routes.get(JOURNAL).primary_endpoint == old
        release = asyncio.Event()
        plain_data = b"in flight across the isolation\n"

        async def body():  # noqa: ANN202
            yield plain_data[:10]
            await release.wait()
            yield plain_data[10:]

        plain = asyncio.ensure_future(client.append(JOURNAL, body()))
        await asyncio.sleep(0.5)  # the primary has the request and the first chunk
        assert not plain.done(), plain
        old_host = cluster.host_at(old)
        named: list[float] = []  # when etcd first named another primary (for the print)

        async def watch_route() -> None:
            async with Client([e for e in cluster.endpoints if e != old], rpc_timeout=2.0) as c:
                while not named:
                    with contextlib.suppress(QuireError, OSError, asyncio.TimeoutError):
                        if (await _primary(c))[0] not in ("", old):
                            named.append(time.monotonic())
                    await asyncio.sleep(0.1)

        cluster.h.isolate(old_host)
        isolated_at = time.monotonic()
        watcher = asyncio.ensure_future(watch_route())
        try:
            release.set()  # the rest and the commit go into the cut link
            txn = Producer.start("in-flight", tmp_path).history().next()
            ident_data = b"identified, sent to the isolated primary\n"
            ident = asyncio.ensure_future(client.append(JOURNAL, ident_data, txn=txn))
            answered: dict[str, float] = {}
            plain.add_done_callback(lambda _: answered.setdefault("plain", time.monotonic()))
            ident.add_done_callback(lambda _: answered.setdefault("ident", time.monotonic()))
            done, _ = await asyncio.wait({plain, ident}, timeout=bound)
            assert ident in done, f"the identified append had no answer {bound:g} s after the isolation"
            assert plain in done, f"the in-flight append had no answer {bound:g} s after the isolation"
            r = ident.result()  # acknowledged: re-sent to the new primary
            outcome = "acknowledged"
            try:
                plain.result()
            except CommitUnknown as exc:  # (an iterator's content cannot be re-sent)
                outcome = f"CommitUnknown: {exc.message[:100]}"
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(watcher), 10.0)
            print(f"\nprimary's host isolated with appends in flight (lease TTL {LEASE_TTL} s, "
                  f"goal {LEASE_TTL + 2} s): etcd named a new primary after "
                  f"{named[0] - isolated_at if named else float('nan'):.1f} s; identified append "
                  f"acknowledged after {answered['ident'] - isolated_at:.1f} s; the in-flight "
                  f"one answered after {answered['plain'] - isolated_at:.1f} s ({outcome})")
            new = client.routes.get(JOURNAL)
            assert new is not None and new.primary_endpoint not in (None, old), new
        finally:
            watcher.cancel()
            cluster.h.heal(old_host)

        async def rejoined() -> bool | NotYet:
            brokers = {b.endpoint for b in await client.list_brokers()}
            primary, members = await _primary(client)
            return (old in brokers and primary not in (None, old) and len(members) == 3) or \
                NotYet(f"brokers {sorted(brokers)}, primary {primary}, members {members}")

        await until("the old primary's coordinator back in the cluster and the route full",
                    90, rejoined)
        content = bytearray()
        async for offset, data in client.read(JOURNAL, r.begin, end_offset=r.end):
            content += data
            if offset + len(data) >= r.end:
                break
        assert bytes(content) == ident_data
        head = await client.write_head(JOURNAL)
        everything = bytearray()
        async for offset, data in client.read(JOURNAL, 0, end_offset=head):
            everything += data
            if offset + len(data) >= head:
                break
        assert everything.count(ident_data) == 1, "the identified append landed twice"
        assert everything.count(plain_data) <= 1
