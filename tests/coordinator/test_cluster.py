"""Multi-process integration: 3-4 coordinator processes on a real etcd."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from protocol import AppendChunk, AppendRequest, AppendResponse, ProtocolError, Status
from protocol.stream import FrameStream

from .cluster import Cluster, Conn, running, spec, wait_appendable

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster3(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root, 3, ["--min-append-rate", "65536"]) as c:
        yield c


@pytest.fixture
def cluster4(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root, 4) as c:
        yield c


async def _setup(c: Cluster, journals: list[str], length: int = 1 << 20) -> None:
    for n in c.nodes:
        await c.wait_listening(n)
    conn = await Conn.open(c.nodes[0].endpoint)
    assert (await conn.apply(*[spec(j, length=length) for j in journals])).status == Status.OK
    await conn.close()
    for j in journals:
        r = await wait_appendable(c.nodes[0].endpoint, j)
        assert r.status == Status.OK, (j, r)


def _payload(writer: int, seq: int, size: int) -> bytes:
    tag = f"<w{writer}:s{seq}>".encode()
    return (tag * (size // len(tag) + 1))[:size]


async def _writer(c: Cluster, wid: int, journals: list[str], count: int, acked: list,
                  errors: list, stop_on_error: bool = False) -> None:
    rng = random.Random(wid)
    seq = 0
    conn: Conn | None = None
    while seq < count:
        journal = rng.choice(journals)
        size = rng.choice([1, 100, 4096, 70_000, 300_000])
        data = _payload(wid, seq, size)
        chunks = [data[i:i + 65536] for i in range(0, len(data), 65536)]
        try:
            if conn is None:
                conn = await Conn.open(rng.choice([n for n in c.nodes if n.proc.poll() is None]).endpoint)
            r = await conn.append(journal, chunks)
        except Exception as exc:  # noqa: BLE001 - a dead broker: the append failed or is unknown
            errors.append(repr(exc))
            if conn is not None:
                conn.s.abort()
            conn = None
            if stop_on_error:
                return
            await asyncio.sleep(0.05)  # back off before retrying on another broker
            continue
        if r.status == Status.OK:
            assert r.commit.end - r.commit.begin == len(data)
            acked.append((journal, r.commit.begin, r.commit.end, data))
            seq += 1
        else:
            errors.append(r.status.name)
            conn.s.abort()
            conn = None
            await asyncio.sleep(0.05)
    if conn is not None:
        await conn.close()


async def _check(c: Cluster, journals: list[str], acked: list, nodes=None) -> None:  # noqa: ANN001
    nodes = nodes or [n for n in c.nodes if n.proc.poll() is None]
    for j in journals:
        mine = sorted((b, e, d) for jj, b, e, d in acked if jj == j)
        if not mine:
            continue
        # Contiguous, never overlapping offsets.
        for (b1, e1, _), (b2, _, _) in zip(mine, mine[1:]):
            assert e1 <= b2, (j, e1, b2)
        head = mine[-1][1]
        contents = {}
        for n in nodes:
            contents[n.suffix] = await _read_retrying(n.endpoint, j, mine[0][0], head)
        base = mine[0][0]
        for n_suffix, data in contents.items():
            for b, e, d in mine:
                assert data[b - base:e - base] == d, (j, n_suffix, b, e)
        assert len(set(contents.values())) == 1, f"replicas of {j} differ"


async def _read_retrying(endpoint: str, journal: str, begin: int, end: int,
                         timeout: float = 30.0) -> bytes:
    """Read [begin, end) from one node, retrying as a client would while routes settle.

    Right after a kill a node may still proxy to the dead primary and drop the
    connection; that is a transient routing state, not lost data.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await Conn.open(endpoint)
            try:
                data, _ = await conn.read(journal, begin, end_offset=end, block=True)
            finally:
                await conn.close()
            return data
        except (OSError, ProtocolError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # back off before asking again


async def test_concurrent_writers_r3(cluster3: Cluster) -> None:
    journals = [f"conc/j{i}" for i in range(5)]
    await _setup(cluster3, journals, length=1 << 20)
    acked: list = []
    errors: list = []
    async with asyncio.TaskGroup() as tg:
        for w in range(20):
            tg.create_task(_writer(cluster3, w, journals, 15, acked, errors))
    assert len(acked) == 300, errors
    await _check(cluster3, journals, acked)


async def test_kill_primary_while_writing(cluster4: Cluster) -> None:
    journals = ["fail/a", "fail/b"]
    await _setup(cluster4, journals)
    ks_conn = await Conn.open(cluster4.nodes[0].endpoint)
    listing = await ks_conn.list()
    await ks_conn.close()
    route = next(e.route for e in listing.journals if e.spec.name == "fail/a")
    victim_id = route.members[route.primary]
    victim = next(n for n in cluster4.nodes if n.suffix == victim_id.suffix)
    acked: list = []
    errors: list = []

    async def killer() -> None:
        while len(acked) < 20:  # let the writers get going first
            await asyncio.sleep(0.01)
        cluster4.kill(victim)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(killer())
        for w in range(8):
            tg.create_task(_writer(cluster4, w, journals, 25, acked, errors))
    assert victim.proc.poll() is not None
    # Every writer finished its quota, so appends resumed on the new primary.
    assert len(acked) == 200
    await _check(cluster4, journals, acked)


async def test_stalled_appender_is_aborted_others_proceed(cluster3: Cluster) -> None:
    await _setup(cluster3, ["stall/j"])
    # Find the primary so the stalled append really holds the pipeline.
    c0 = await Conn.open(cluster3.nodes[0].endpoint)
    listing = await c0.list()
    await c0.close()
    route = next(e.route for e in listing.journals if e.spec.name == "stall/j")
    primary = next(n for n in cluster3.nodes if n.suffix == route.members[route.primary].suffix)
    stalled = await Conn.open(primary.endpoint)
    stalled.s.write(AppendRequest(journal="stall/j"))
    stalled.s.write(AppendChunk(), b"x" * 1000)
    await stalled.s.drain()
    t0 = time.monotonic()
    ok = await Conn.open(primary.endpoint)
    r = await ok.append("stall/j", [b"after the stall"])
    assert r.status == Status.OK
    assert time.monotonic() - t0 < 5.0
    # The stalled append was rolled back: its bytes never show up.
    msg, _ = await asyncio.wait_for(stalled.s.read_message(AppendResponse), 10.0)
    assert msg.status == Status.ABORTED and "too slow" in msg.message
    data, _ = await ok.read("stall/j", r.commit.begin, end_offset=r.commit.end)
    assert data == b"after the stall"
    assert r.commit.begin == 0  # the aborted bytes' offsets were re-used
    await ok.close()
    await stalled.close()


async def test_garbage_frames_disconnect_only_that_client(cluster3: Cluster) -> None:
    await _setup(cluster3, ["garbage/j"])
    node = cluster3.nodes[0]
    good = await Conn.open(node.endpoint)
    host, port = node.endpoint.split(":")
    for junk in (b"\xff" * 64, b"\x00\x00\x00\x07\x0a\x00\x00\x00\x09abc", b"GET / HTTP/1.1\r\n\r\n"):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(junk)
        await writer.drain()
        # The server answers with an ErrorFrame (or nothing) and closes.
        rest = await asyncio.wait_for(reader.read(), 10.0)
        assert reader.at_eof()
        writer.close()
        await writer.wait_closed()
        del rest
    r = await good.append("garbage/j", [b"still fine"])
    assert r.status == Status.OK
    await good.close()
