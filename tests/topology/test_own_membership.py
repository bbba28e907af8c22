"""A member watches its own membership (topology/membership.py), and every watch
survives compaction, etcd restarts and pauses — against a real etcd.

Waits are bounded waits on conditions (an asyncio.Event, the keyspace's change
broadcast), never sleeps standing in for readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aetcd
import pytest

from protocol import ProcessId
from tools.services import EtcdService
from topology.etcd import assignment_key, connect, member_key
from topology.keyspace import KeySpace
from topology.membership import BrokerSpec, Membership, doubt_margin, own_key_verdict
from topology.watch import WatchEnded, watch_events

from .conftest import wait_until

A = ProcessId("a", "own-1")

pytestmark = pytest.mark.timeout(60)


def test_own_key_verdict() -> None:
    assert own_key_verdict(True, 7, 7) is None
    assert own_key_verdict(False, 0, 7) == "member key deleted"
    assert "not ours" in own_key_verdict(True, 8, 7)
    assert "not ours" in own_key_verdict(True, 0, 7)


def test_doubt_margin() -> None:
    assert doubt_margin(3) == pytest.approx(0.6)
    assert doubt_margin(20) == 1.0


async def _until(event: asyncio.Event, timeout: float) -> float:
    started = time.monotonic()
    await asyncio.wait_for(event.wait(), timeout)
    return time.monotonic() - started


async def _holds(predicate, timeout: float) -> None:
    """Bounded wait for an in-process condition set by another task of this loop."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)  # yield to the task that sets it


async def _maintained(client: aetcd.Client, root: str, ttl: float = 3):
    """A Membership whose `maintain` runs, recording every fence call."""
    fenced: list[str] = []
    fence_done = asyncio.Event()

    async def fence(reason: str) -> None:
        fenced.append(reason)
        fence_done.set()

    m = Membership(client, root, BrokerSpec(id=A, endpoint="127.0.0.1:1"), ttl=ttl)
    return m, fenced, fence_done, fence


@pytest.mark.parametrize("how", ["delete-key", "revoke-lease"])
async def test_lost_member_fences_revokes_and_reannounces(client: aetcd.Client, etcd_root: str,
                                                         how: str) -> None:
    m, fenced, fence_done, fence = await _maintained(client, etcd_root)
    async with KeySpace(client, etcd_root) as ks, m:
        keeper = asyncio.create_task(m.maintain(fence))
        try:
            old = m.lease_id
            # Something the old incarnation holds: an assignment under its lease.
            akey = assignment_key(etcd_root, "own/j", A, 0).encode()
            await client.put(akey, b"{}", lease=old)
            await wait_until(ks, lambda: ks.assignments_of(A), 5)
            standing: list[bool] = []
            m.on_standing.append(standing.append)
            if how == "delete-key":
                await client.delete(member_key(etcd_root, A).encode())
            else:
                await client.revoke_lease(old)
            # Noticed at once (the own-key watch), not at the next refresh.
            assert await _until(fence_done, 2.0) < 1.0
            assert fenced == ["member key deleted"]
            assert standing[0] is False
            # Re-announced under a fresh lease; the old lease was revoked (fence), so
            # nothing it held survives beside the new incarnation.
            await wait_until(ks, lambda: A in ks.members and ks.members[A].lease != old
                             and not ks.assignments_of(A), 5, "re-announced, old keys gone")
            await _holds(lambda: not m.lost.is_set(), 5.0)  # renew() returns after the put
            assert m.lease_id == ks.members[A].lease and m.lease_id != old
            assert m.in_good_standing
            assert standing[-1] is True
            info = await client.get_lease_info(old)
            assert info.TTL <= 0  # revoked
            # And the new incarnation is watched too.
            fence_done.clear()
            await client.delete(member_key(etcd_root, A).encode())
            await _until(fence_done, 2.0)
            await wait_until(ks, lambda: A in ks.members, 5)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper


async def test_key_rewritten_under_another_lease_is_lost(client: aetcd.Client, etcd_root: str) -> None:
    async with Membership(client, etcd_root, BrokerSpec(id=A), ttl=3) as m:
        other = await client.lease(5)
        await client.put(member_key(etcd_root, A).encode(), b'{"id": "a#own-1"}', lease=other)
        await _until(m.lost, 2.0)
        assert "not ours" in m.lost_reason
        await client.revoke_lease(other.id)


async def test_watch_from_a_compacted_revision_ends_with_compacted(client: aetcd.Client,
                                                                  etcd_root: str) -> None:
    key = f"{etcd_root}/x".encode()
    first = (await client.put(key, b"1")).header.revision
    current = (await client.put(key, b"2")).header.revision
    await client.compact(current)
    with pytest.raises(WatchEnded) as info:
        async with contextlib.aclosing(watch_events(client, key, first)) as batches:
            async for _ in batches:
                pass
    assert info.value.compacted >= current


async def test_keyspace_relists_after_compaction(client: aetcd.Client, etcd_root: str) -> None:
    """The mirror's next revision was compacted away while its watch was down: the
    watch ends with `compacted`, the mirror re-lists and keeps following."""
    key = f"{etcd_root}/journals/".encode()
    ks = KeySpace(client, etcd_root)
    await ks._load()
    spec = b'{"name": "own/c", "replication": 1}'
    rev = (await client.put(key + b"own/c", spec)).header.revision
    await client.compact(rev)
    ks._task = asyncio.create_task(ks._run())
    async with ks:
        await wait_until(ks, lambda: "own/c" in ks.journals, 10, "re-listed after compaction")
        rev = (await client.put(key + b"own/d", spec.replace(b"own/c", b"own/d"))).header.revision
        assert await ks.wait_for_revision(rev, 5)
        assert "own/d" in ks.journals


async def test_own_key_watch_survives_compaction(client: aetcd.Client, etcd_root: str) -> None:
    async with Membership(client, etcd_root, BrokerSpec(id=A), ttl=3) as m:
        resp = await client.put(f"{etcd_root}/unrelated".encode(), b"x")
        await client.compact(resp.header.revision)
        assert not m.lost.is_set()
        await client.delete(member_key(etcd_root, A).encode())
        await _until(m.lost, 2.0)


async def test_paused_etcd_puts_the_member_in_doubt_before_its_lease_could_expire(
        etcd_root: str) -> None:
    """etcd SIGSTOPped past the lease TTL: the member stops vouching for its lease
    (standing False) before TTL elapses since its last confirmed refresh; after
    SIGCONT it is confirmed again or, if etcd expired the lease meanwhile, lost and
    re-announced by `maintain`."""
    with EtcdService("etcd-own-pause") as etcd:
        c = await connect(etcd.url, timeout=2.0)
        try:
            m, _, _, fence = await _maintained(c, etcd_root, ttl=2)
            async with m:
                keeper = asyncio.create_task(m.maintain(fence))
                doubt = asyncio.Event()
                good = asyncio.Event()
                seen: list[tuple[float, float]] = []

                def on_standing(ok: bool) -> None:
                    if not ok:
                        seen.append((time.monotonic(), m.valid_until))
                    (good if ok else doubt).set()
                m.on_standing.append(on_standing)
                etcd.pause()
                try:
                    await _until(doubt, 5.0)
                    assert not m.in_good_standing
                    # In doubt before the lease could have expired in etcd: etcd
                    # restarted its countdown after the last confirmed refresh was sent.
                    at, proven = seen[0]
                    assert at < proven
                finally:
                    etcd.resume()
                await _until(good, 15.0)
                assert m.in_good_standing
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
        finally:
            await c.close()


async def test_own_key_watch_survives_etcd_restart(etcd_root: str) -> None:
    with EtcdService("etcd-own-restart") as etcd:
        c = await connect(etcd.url, timeout=2.0)
        try:
            async with Membership(c, etcd_root, BrokerSpec(id=A), ttl=5) as m:
                await asyncio.to_thread(etcd.stop)
                await asyncio.to_thread(etcd.start)
                for _ in range(50):  # the client channel reconnects on its own schedule
                    try:
                        await c.delete(member_key(etcd_root, A).encode())
                        break
                    except Exception:  # noqa: BLE001 - etcd still coming back
                        await asyncio.sleep(0.2)
                await _until(m.lost, 5.0)
                assert m.lost_reason == "member key deleted"
        finally:
            await c.close()


async def test_a_member_starting_while_etcd_is_down_waits_for_it(etcd_root: str) -> None:
    """A supervisor's restart often races an etcd restart: announcing waits (bounded)
    for etcd instead of exiting (chaos: consumer members restarted during etcd-restart
    faults exited 1 three times and were given up)."""
    with EtcdService("etcd-own-late") as etcd:
        c = await connect(etcd.url, timeout=2.0)
        try:
            await asyncio.to_thread(etcd.stop)
            entering = asyncio.ensure_future(
                Membership(c, etcd_root, BrokerSpec(id=A), ttl=5).__aenter__())
            done, _ = await asyncio.wait({entering}, timeout=2.0)
            assert not done, entering.result()  # waiting, not failed
            await asyncio.to_thread(etcd.start)
            m = await asyncio.wait_for(entering, 60.0)
            try:
                assert not m.lost.is_set()
                got = await c.get(member_key(etcd_root, A).encode())
                assert got is not None
            finally:
                await m.__aexit__(None, None, None)
        finally:
            await c.close()
