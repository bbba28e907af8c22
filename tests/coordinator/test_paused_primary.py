"""A primary SIGSTOPped past its lease TTL, then woken (docs/reliability.md findings 2-4).

The woken stale primary must not acknowledge an append it finds in its socket buffer
after its route was superseded (the replicas fence it, coordinator/fence.py); every
append acknowledged before or during the pause stays readable from every member; the
woken coordinator re-announces itself under a new lease; appends resume everywhere and
every member reports a write head at or past the last acknowledged end.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from protocol import ListBrokersRequest, ListBrokersResponse, Status

from .cluster import Cluster, Conn, journal_route, running, spec, wait_appendable

pytestmark = pytest.mark.timeout(150)

J = "pause/j"


@pytest.fixture
def cluster4(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root, 4) as c:  # --lease-ttl 3 (cluster.py)
        try:
            yield c
        finally:
            for n in c.nodes:  # a paused one could not be stopped
                if n.proc is not None and n.proc.poll() is None:
                    n.proc.send_signal(signal.SIGCONT)


async def _until(pred, timeout: float = 40.0):  # noqa: ANN001, ANN202
    """Poll another process's observable state until `pred` (an async callable) holds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await pred()
        except (OSError, asyncio.TimeoutError, ConnectionError):
            value = None
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


async def _append(endpoint: str, data: bytes):  # noqa: ANN202
    conn = await Conn.open(endpoint)
    try:
        return await conn.append(J, [data])
    finally:
        await conn.close()


async def test_paused_primary_is_fenced_and_nothing_acked_is_lost(cluster4: Cluster) -> None:
    c = cluster4
    for n in c.nodes:
        await c.wait_listening(n)
    conn = await Conn.open(c.nodes[0].endpoint)
    assert (await conn.apply(spec(J, replication=3))).status == Status.OK
    await conn.close()
    assert (await wait_appendable(c.nodes[0].endpoint, J)).status == Status.OK

    route = await journal_route(c.nodes[0].endpoint, J)
    victim_id = route.members[route.primary]
    victim = next(n for n in c.nodes if n.suffix == victim_id.suffix)
    others = [n for n in c.nodes if n is not victim]
    acked: list[tuple[bytes, int, int]] = []

    for i in range(20):  # acknowledged, spooled only (no store here): replicas hold them
        data = f"before-{i:03d}\n".encode() * 10
        r = await _append(victim.endpoint, data)
        assert r.status == Status.OK, r
        acked.append((data, r.commit.begin, r.commit.end))

    stale = await Conn.open(victim.endpoint)  # handshake done before the pause
    c.kill(victim, signal.SIGSTOP)
    # Queued in the paused primary's socket buffer: it sees this only after SIGCONT.
    stale_data = b"stale-append\n" * 10
    stale_task = asyncio.ensure_future(stale.append(J, [stale_data]))

    async def superseded():  # noqa: ANN202
        r = await journal_route(others[0].endpoint, J)
        return r.primary >= 0 and r.members[r.primary] != victim_id and victim_id not in r.members
    assert await _until(superseded), "the allocator never replaced the paused primary"
    assert (await wait_appendable(others[0].endpoint, J, timeout=40)).status == Status.OK
    for i in range(10):
        data = f"during-{i:03d}\n".encode() * 10
        r = await _append(others[i % len(others)].endpoint, data)
        assert r.status == Status.OK, r
        acked.append((data, r.commit.begin, r.commit.end))

    c.kill(victim, signal.SIGCONT)
    try:
        resp = await asyncio.wait_for(stale_task, 40)
        stale_status = resp.status
    except Exception:  # noqa: BLE001 - the woken coordinator may just close the connection
        stale_status = None
    await stale.close()
    # Fenced: the replicas aborted its streams when they saw the new route.
    assert stale_status != Status.OK, "a woken stale primary acknowledged an append"

    # The woken coordinator noticed its lease expired and re-announced itself.
    async def re_announced():  # noqa: ANN202
        s = await Conn.open(others[0].endpoint)
        try:
            await s.s.send(ListBrokersRequest())
            msg, _ = await asyncio.wait_for(s.s.read_message(ListBrokersResponse), 10)
        finally:
            await s.close()
        return any(b.id == victim_id for b in msg.brokers)
    assert await _until(re_announced), c.tail(victim)

    # Appends resume, through every coordinator (the woken one included).
    for i, n in enumerate(c.nodes):
        assert (await wait_appendable(n.endpoint, J, timeout=40)).status == Status.OK, c.tail(n)
        data = f"after-{i:03d}\n".encode() * 10
        r = await _append(n.endpoint, data)
        assert r.status == Status.OK, r
        acked.append((data, r.commit.begin, r.commit.end))
    last = max(end for _, _, end in acked)

    # Every member reports a head past the last ack; the members that held the journal
    # throughout serve every acknowledged byte (the woken one was rolled forward past
    # offsets it never received: without a fragment store it cannot serve those).
    # The allocator adds a replica before it removes one, so the route may briefly hold
    # four members; wait for it to settle at the journal's replication.
    async def settled() -> bool:
        return len((await journal_route(others[0].endpoint, J)).members) == 3

    await _until(settled)
    route = await journal_route(others[0].endpoint, J)
    members = [n for n in c.nodes if any(m.suffix == n.suffix for m in route.members)]
    assert len(members) == 3
    for n in members:
        reader = await Conn.open(n.endpoint)
        try:
            _, metas = await reader.read(J, -1)
            assert metas[0].write_head >= last, (n.suffix, metas[0], last)
            if n is victim:
                continue
            content, _ = await reader.read(J, 0, end_offset=last, block=True)
        finally:
            await reader.close()
        assert len(content) == last, (n.suffix, len(content), last)
        for data, begin, end in acked:
            assert content[begin:end] == data, (n.suffix, begin, end)
        assert content.count(b"stale-append") == 0
