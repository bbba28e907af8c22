from __future__ import annotations

import shutil

import pytest

from protocol import Status

from .cluster import Cluster, Conn, make_workdir, spec, wait_appendable


@pytest.fixture
def cluster(etcd, etcd_root):  # noqa: ANN001, ANN201
    c = Cluster(etcd.url, etcd_root, make_workdir())
    for i in range(3):
        c.add(f"zone-{i % 2}", f"node-{i}")
    for n in c.nodes:
        c.start(n)
    try:
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(c.workdir, ignore_errors=True)


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
