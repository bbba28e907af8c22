from __future__ import annotations

import asyncio

import pytest

from protocol import ListFragmentsRequest, ListFragmentsResponse, ReadRequest, ReadResponse, Status

from .cluster import Cluster, Conn, running, spec, wait_appendable


@pytest.fixture
def cluster(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root) as c:
        yield c


async def test_append_and_read_r3(cluster: Cluster) -> None:
    for n in cluster.nodes:
        await cluster.wait_listening(n)
    conn = await Conn.open(cluster.nodes[0].endpoint)
    resp = await conn.apply(spec("smoke/one"))
    assert resp.status == Status.OK, resp
    barrier = await wait_appendable(cluster.nodes[0].endpoint, "smoke/one")
    assert barrier.status == Status.OK, (barrier, [cluster.tail(n) for n in cluster.nodes])
    r = await conn.append("smoke/one", [b"hello ", b"world"])
    assert r.status == Status.OK, r
    assert r.commit.end - r.commit.begin == 11
    for n in cluster.nodes:
        c = await Conn.open(n.endpoint)
        data, metas = await c.read("smoke/one", r.commit.begin, end_offset=r.commit.end)
        assert data == b"hello world", (n.suffix, metas)
        await c.close()
    await conn.close()


async def test_a_connection_carries_on_after_a_blocking_read_ends(cluster: Cluster) -> None:
    """A blocking read watches its connection for the client going away; that watch must
    be gone (not merely cancelled) before the connection's next RPC is read, or the next
    read fails ("another coroutine is already waiting") or loses a byte of the next frame."""
    for n in cluster.nodes:
        await cluster.wait_listening(n)
    writer = await Conn.open(cluster.nodes[0].endpoint)
    assert (await writer.apply(spec("smoke/again"))).status == Status.OK
    assert (await wait_appendable(cluster.nodes[0].endpoint, "smoke/again")).status == Status.OK
    reader = await Conn.open(cluster.nodes[1].endpoint)
    head = 0
    for i in range(10):
        # Block at the head until an append lands, up to end_offset; then at once another
        # RPC on the same connection.
        blocked = asyncio.ensure_future(reader.read("smoke/again", head, end_offset=head + 5,
                                                    block=True))
        r = await writer.append("smoke/again", [b"%05d" % i])
        assert r.status == Status.OK, r
        data, _ = await asyncio.wait_for(blocked, 30)
        assert data == b"%05d" % i
        again, _ = await reader.read("smoke/again", head, end_offset=head + 5)
        assert again == data
        assert (await reader.list()).status == Status.OK
        head = r.commit.end
    await reader.close()
    await writer.close()


async def test_reads_and_listings_through_a_coordinator_outside_the_route(cluster: Cluster) -> None:
    """A coordinator that holds nothing of a journal forwards to a member, and its RPC
    ends where the member's does (end_offset, metadata only), so the connection goes on."""
    for n in cluster.nodes:
        await cluster.wait_listening(n)
    conn = await Conn.open(cluster.nodes[0].endpoint)
    assert (await conn.apply(spec("smoke/single", replication=1))).status == Status.OK
    assert (await wait_appendable(cluster.nodes[0].endpoint, "smoke/single")).status == Status.OK
    r = await conn.append("smoke/single", [b"0123456789"])
    assert r.status == Status.OK, r
    listing = await conn.list()
    route = next(j.route for j in listing.journals if j.spec.name == "smoke/single")
    member = route.members[route.primary].suffix
    outsider = next(n for n in cluster.nodes if n.suffix != member)
    c = await Conn.open(outsider.endpoint)
    for _ in range(3):
        data, metas = await asyncio.wait_for(c.read("smoke/single", 0, end_offset=10), 30)
        assert data == b"0123456789", metas
        await c.s.send(ReadRequest(journal="smoke/single", offset=0, metadata_only=True))
        meta, _ = await asyncio.wait_for(c.s.read_message(ReadResponse), 30)
        assert meta.status == Status.OK and meta.fragment is not None
        await c.s.send(ListFragmentsRequest(journal="smoke/single"))
        frags, _ = await asyncio.wait_for(c.s.read_message(ListFragmentsResponse), 30)
        assert frags.status == Status.OK
        assert [(f.spec.begin, f.spec.end) for f in frags.fragments] == [(0, 10)]
    await c.close()
    await conn.close()
