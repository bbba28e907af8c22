"""Why a watch can show one key twice, and why no watcher of quire acts on an event twice.

The host test `test_a_watch_survives_its_member_being_cut` once saw `/w/2` twice. The watch
was right: the test's writer had retried a put whose answer it never got, and the first
attempt had been committed, so etcd held two writes of `/w/2` at two revisions. Here that
is made deterministic: a proxy in front of etcd passes the request and holds the answer,
the client times out, the connection is reset, and the write is retried.

Invariants (docs/operations.md, "etcd as a cluster"):
- a write that may be retried is guarded (quire's own are all revision- or
  create-guarded transactions; tests/etcd_writes.py for tests);
- a watcher resumes from the last revision it has applied + 1, and applies events
  idempotently by revision: an event at or below the revision it is complete through
  is skipped (KeySpace._apply_batch, consumers.mirror).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aetcd
import msgspec
import pytest_asyncio
from aetcd import rpc

from chaos.proxy import Fault, FaultMode, FaultProxy
from protocol import JournalSpec
from tests.etcd_writes import create_once
from topology.etcd import connect, journal_key
from topology.keyspace import KeySpace
from topology.watch import watch_events
from tools.services import EtcdService


@pytest_asyncio.fixture(loop_scope="function")
async def proxy(etcd: EtcdService) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("etcd", etcd.url.split("://", 1)[1]) as p:
        yield p


async def _events(etcd: EtcdService, key: bytes, start: int, count: int,
                  within: float = 5.0) -> list[int]:
    """The mod revisions of the PUT events of `key` from `start` on: `count` of them, or
    every one that arrived within `within` seconds."""
    revisions: list[int] = []
    client = await connect(etcd.url)
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                async with contextlib.aclosing(watch_events(client, key, start)) as batches:
                    async for resp in batches:
                        revisions += [ev.kv.mod_revision for ev in resp.events
                                      if ev.type == rpc.Event.PUT]
                        if len(revisions) >= count:
                            break
    finally:
        await client.close()
    return revisions


async def _lost_answer(etcd: EtcdService, proxy: FaultProxy, key: bytes,
                       write: Callable[[aetcd.Client], Awaitable[object]]) -> tuple[int, object]:
    """Run `write` through the proxy with etcd's answers held back; once etcd has committed
    `key`, reset the connection so the answer is lost (the client is still waiting on it),
    and let the write's own retries finish. Returns the revision before the write and
    what `write` returned."""
    direct = await connect(etcd.url)
    via = await connect(f"http://{proxy.endpoint}")
    try:
        start = (await direct.put(key + b"/start", b"")).header.revision
        await via.get(key)  # the connection through the proxy is up before the fault
        proxy.set_fault(Fault(FaultMode.ONE_WAY, direction="down"))
        task = asyncio.get_running_loop().create_task(write(via))
        deadline = time.monotonic() + 10
        while (await direct.get(key)) is None:
            assert time.monotonic() < deadline, "the write never reached etcd"
            await asyncio.sleep(0.02)
        assert not task.done(), "the answer reached the client through a held-back link"
        proxy.set_fault(Fault(FaultMode.RESET))
        proxy.heal()
        return start, await asyncio.wait_for(task, 15)
    finally:
        await via.close()
        await direct.close()


async def test_a_write_retried_blindly_after_its_answer_was_lost_is_written_twice(
        etcd: EtcdService, etcd_root: str, proxy: FaultProxy) -> None:
    key = f"{etcd_root}/blind".encode()

    async def blind_put(via: aetcd.Client) -> None:
        # What the host test's writer did: a put, retried on any failure.
        while True:
            try:
                await asyncio.wait_for(via.put(key, b"x"), 1.0)
                return
            except Exception:  # noqa: BLE001 - timed out / reset
                await asyncio.sleep(0.05)

    start, _ = await _lost_answer(etcd, proxy, key, blind_put)
    revisions = await _events(etcd, key, start + 1, count=2)
    assert len(revisions) == 2 and revisions[0] < revisions[1], revisions


async def test_a_guarded_write_retried_after_its_answer_was_lost_is_written_once(
        etcd: EtcdService, etcd_root: str, proxy: FaultProxy) -> None:
    key = f"{etcd_root}/guarded".encode()
    start, created = await _lost_answer(etcd, proxy, key,
                                        lambda via: create_once(via, key, b"x", attempt=1.0))
    assert await _events(etcd, key, start + 1, count=2, within=2.0) == [created]


async def test_the_keyspace_never_applies_an_event_twice(etcd: EtcdService, etcd_root: str) -> None:
    client = await connect(etcd.url)
    try:
        key = journal_key(etcd_root, "logs/one").encode()
        old = msgspec.json.encode(JournalSpec(name="logs/one", replication=1))
        new = msgspec.json.encode(JournalSpec(name="logs/one", replication=2))
        first = (await client.put(key, old)).header.revision
        async with KeySpace(client, etcd_root) as ks:
            second = (await client.put(key, new)).header.revision
            assert await ks.wait_for_revision(second, timeout=10)
            changes: list[int] = []
            ks.on_change.append(lambda k: changes.append(k.revision))
            # The first write's response, delivered again (a watch resumed from an older
            # revision): the mirror must keep the newer spec and announce no change.
            again = rpc.WatchResponse(
                header=rpc.ResponseHeader(revision=first),
                events=[rpc.Event(type=rpc.Event.PUT, kv=rpc.KeyValue(
                    key=key, value=old, create_revision=first, mod_revision=first, version=1))])
            ks._apply_batch(again)  # noqa: SLF001 - the watch's own entry point
            assert ks.journals["logs/one"].spec.replication == 2
            assert ks.journals["logs/one"].mod_revision == second
            assert ks.revision >= second and changes == []
            # And a newer event still applies.
            newer = msgspec.json.encode(JournalSpec(name="logs/one", replication=3))
            third = (await client.put(key, newer)).header.revision
            assert await ks.wait_for_revision(third, timeout=10)
            assert ks.journals["logs/one"].spec.replication == 3 and changes
    finally:
        await client.close()
