"""aetcd against a real etcd: the operations the coordinator is built on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aetcd
import pytest

from tools.services import EtcdService


def client_for(etcd: EtcdService) -> aetcd.Client:
    return aetcd.Client(etcd.host, etcd.port, timeout=5)


async def test_put_get_prefix(etcd: EtcdService, etcd_root: str) -> None:
    async with client_for(etcd) as c:
        await c.put(f"{etcd_root}/specs/a".encode(), b"alpha")
        await c.put(f"{etcd_root}/specs/b".encode(), b"beta")
        got = await c.get(f"{etcd_root}/specs/a".encode())
        assert got is not None and got.value == b"alpha"
        assert await c.get(f"{etcd_root}/specs/missing".encode()) is None
        listed = await c.get_prefix(f"{etcd_root}/specs/".encode())
        assert [kv.value for kv in listed] == [b"alpha", b"beta"]


async def test_watch_sees_puts_and_deletes(etcd: EtcdService, etcd_root: str) -> None:
    key = f"{etcd_root}/members/zone-a#b1".encode()
    async with client_for(etcd) as c:
        watch = await c.watch_prefix(f"{etcd_root}/members/".encode())
        try:
            await c.put(key, b"v1")
            await c.delete(key)
            events = []
            async with asyncio.timeout(10):
                async for event in watch:
                    events.append((event.kind, event.kv.key))
                    if len(events) == 2:
                        break
        finally:
            await watch.cancel()
    assert events == [("PUT", key), ("DELETE", key)]


async def test_lease_revocation_deletes_attached_keys(etcd: EtcdService, etcd_root: str) -> None:
    key = f"{etcd_root}/members/b1".encode()
    async with client_for(etcd) as c:
        lease = await c.lease(30)
        await c.put(key, b"member", lease=lease)
        assert await lease.keys() == [key]
        assert 0 < await lease.remaining_ttl() <= 30
        await lease.refresh()
        await lease.revoke()
        assert await c.get(key) is None


async def test_transaction_with_version_compare(etcd: EtcdService, etcd_root: str) -> None:
    key = f"{etcd_root}/assign/j1#b1#0".encode()
    async with client_for(etcd) as c:
        t = c.transactions

        async def create_if_absent(value: bytes) -> bool:
            ok, _ = await c.transaction(
                compare=[t.version(key) == 0], success=[t.put(key, value)], failure=[]
            )
            return ok

        assert await create_if_absent(b"first") is True
        assert await create_if_absent(b"second") is False
        got = await c.get(key)
        assert got is not None and got.value == b"first"


@pytest.fixture
def private_etcd() -> Iterator[EtcdService]:
    # Its own etcd: killing the session one would break every other test.
    with EtcdService("etcd-restart", ready_timeout=30) as svc:
        yield svc


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "kill-9"])
async def test_data_survives_restart(private_etcd: EtcdService, crash: bool) -> None:
    async with client_for(private_etcd) as c:
        put = await c.put(b"/quire/specs/j1", b"spec-v1")
        revision = put.header.revision
    port, data_dir = private_etcd.port, private_etcd.data_dir

    if crash:
        private_etcd.kill()
    else:
        private_etcd.stop()
    private_etcd.start()
    assert (private_etcd.port, private_etcd.data_dir) == (port, data_dir)

    async with client_for(private_etcd) as fresh:
        got = await fresh.get(b"/quire/specs/j1")
        assert got is not None and got.value == b"spec-v1"
        assert got.mod_revision == revision
