"""The etcd client against a real three-member cluster: losing the member a client
talks to is invisible — reads and writes go on, a watch misses no event, a lease
stays alive — and bad endpoint lists get typed errors naming etcd."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from topology.etcd import EtcdError, TopologyError, client_for, connect, put_op, txn
from topology.etcd_client import EtcdTLS, parse_endpoints
from topology.watch import WatchEnded, watch_events
from tools.services import Service
from tools.services.etcd import EtcdCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(3) as c:
        yield c


def _restart_all(cluster: EtcdCluster) -> None:
    for member in cluster.members:
        if not member.running:
            member.start(wait=False)
    for member in cluster.members:
        member.wait_ready()


def test_endpoint_lists_parse_and_refuse_clearly() -> None:
    eps = parse_endpoints("http://127.0.0.1:1,127.0.0.2:2 , http://[::1]:3")
    assert [str(e) for e in eps] == ["http://127.0.0.1:1", "http://127.0.0.2:2", "http://[::1]:3"]
    with pytest.raises(TopologyError, match="etcd.*mix http:// and https://.*QUIRE_ETCD_URL"):
        client_for("http://127.0.0.1:1,https://127.0.0.1:2")
    with pytest.raises(TopologyError, match="ftp://x.*expected http"):
        client_for("ftp://x:1")
    with pytest.raises(TopologyError, match="https:// but no CA"):
        client_for("https://127.0.0.1:2379", tls=None)
    assert EtcdTLS.from_env({}) is None
    assert EtcdTLS.from_env({"QUIRE_ETCD_CA": "/ca.pem"}) == EtcdTLS("/ca.pem")


async def test_unreachable_etcd_fails_fast_naming_it() -> None:
    dead = f"http://127.0.0.1:{_dead_port()},http://127.0.0.1:{_dead_port()}"
    started = time.monotonic()
    with pytest.raises(EtcdError) as err:
        await connect(dead, probe=3.0)
    assert time.monotonic() - started < 5.0
    text = str(err.value)
    assert "etcd unreachable at" in text and dead in text and "QUIRE_ETCD_URL" in text
    assert "\n" not in text


def _dead_port() -> int:
    from tools.services import free_port
    return free_port()  # nothing listens there


async def _on_a_follower(client, cluster: EtcdCluster):  # type: ignore[no-untyped-def]
    """Move `client` to a member that is not etcd's leader, and return that member: the
    test is about the client's failover, not about the election a dead leader causes."""
    leader = (await client.status()).leader
    leader_ports = {int(u.rsplit(":", 1)[1]) for u in leader.client_urls}
    for _ in range(len(cluster.members)):
        if client.current.port not in leader_ports:
            break
        client.fail_over("test: leave the leader")
        await client.connect()
    return next(m for m in cluster.members if m.port == client.current.port)


async def test_killing_the_current_member_is_invisible(cluster: EtcdCluster) -> None:
    client = await connect(cluster.url, probe=5.0)
    try:
        await client.put(b"/t/a", b"1")
        victim = await _on_a_follower(client, cluster)
        victim.kill()
        try:
            started = time.monotonic()
            # A read or write right after the kill may fail once (the call in flight);
            # within two seconds the client is on another member and everything works.
            value = None
            while value is None and time.monotonic() - started < 2.0:
                with contextlib.suppress(Exception):
                    await client.put(b"/t/b", b"2")
                    value = (await client.get(b"/t/b")).value
                if value is None:
                    await asyncio.sleep(0.05)
            assert value == b"2", "the client did not move to a live member within 2 s"
            assert client.current.port != victim.port and client.failovers >= 1
            result = await txn(client, [], [put_op(b"/t/c", b"3")])
            assert result.succeeded
        finally:
            _restart_all(cluster)
    finally:
        await client.close()


async def test_a_watch_and_a_lease_survive_their_member(cluster: EtcdCluster) -> None:
    watcher = await connect(cluster.url)
    writer = await connect(cluster.url)
    try:
        lease = await watcher.lease(4)
        await watcher.put(b"/w/leased", b"x", lease=lease)
        start = (await writer.get(b"/w/leased")).mod_revision + 1
        seen: list[bytes] = []

        async def watch() -> None:
            # What every quire watcher does: resume from the last revision it saw.
            revision = start
            while True:
                try:
                    async with contextlib.aclosing(
                            watch_events(watcher, b"/w/n/", revision, prefix=True)) as events:
                        async for resp in events:
                            for ev in resp.events:
                                seen.append(ev.kv.key)
                            revision = resp.header.revision + 1
                except (WatchEnded, Exception):  # noqa: BLE001 - re-watch, as the mirror does
                    await asyncio.sleep(0.05)

        async def keep_alive() -> None:
            while True:
                with contextlib.suppress(Exception):
                    await watcher.refresh_lease(lease.id)
                await asyncio.sleep(0.5)

        victim = await _on_a_follower(watcher, cluster)
        tasks = [asyncio.create_task(watch()), asyncio.create_task(keep_alive())]
        try:
            # The writer must not share the victim, or its own failover hides nothing.
            while writer.current.port == victim.port:
                writer.fail_over("test: use another member than the watcher")
                await writer.connect()
            keys = [f"/w/n/{i:03d}".encode() for i in range(40)]
            for i, key in enumerate(keys):
                if i == 10:
                    victim.kill()
                await writer.put(key, b"v")
                await asyncio.sleep(0.05)
            deadline = time.monotonic() + 10.0
            while sorted(set(seen)) != keys and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert sorted(set(seen)) == keys, f"missing {sorted(set(keys) - set(seen))[:5]}"
            # The lease was granted for 4 s; 2 s of kills and writes later it still holds.
            assert (await writer.get(b"/w/leased")).value == b"x"
            assert watcher.current.port != victim.port
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            _restart_all(cluster)
    finally:
        await watcher.close()
        await writer.close()


def test_cluster_members_are_services(cluster: EtcdCluster) -> None:
    assert all(isinstance(m, Service) and m.running for m in cluster.members)
    assert cluster.url.count(",") == 2
