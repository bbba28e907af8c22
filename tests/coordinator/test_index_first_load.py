"""A primary does not take appends before its replica's first fragment-index load.

Chaos found the head of a journal back at 0 after a route was rebuilt from members
that had all lost their spools: the new primary did not know the index yet, so the
INDEX_HAS_GREATER_OFFSET guard had nothing to compare with and appends were
acknowledged at offsets the store already held. Like Gazette's
WaitForFirstRemoteRefresh, the primary now waits for the first load (bounded)."""

from __future__ import annotations

import asyncio
import os
import shutil

import msgspec
import pytest
import redis

from protocol import Status
from protocol.fragment import Codec, Fragment
from tools.services import RedisService

from .cluster import Cluster, Conn, make_workdir, spec

pytestmark = pytest.mark.timeout(120)

J = "index-first/j"
ROUTING = (Status.INSUFFICIENT_JOURNAL_BROKERS, Status.NO_JOURNAL_PRIMARY_BROKER,
           Status.JOURNAL_NOT_FOUND)


async def test_an_append_waits_for_the_index_and_is_refused_below_its_end(etcd, etcd_root) -> None:  # noqa: ANN001
    with RedisService("redis-index-first") as rds:
        persisted = Fragment(journal=J, begin=0, end=1000, sum="a" * 40, codec=Codec.NONE,
                             backing_store="file:///nowhere/")
        redis.Redis.from_url(rds.url).set("quire:index:" + J, msgspec.json.encode((persisted,)))
        c = Cluster(etcd.url, etcd_root, make_workdir(), extra=["--redis", rds.url])
        node = c.add("zone-0", "node-0")
        try:
            c.start(node)
            await c.wait_listening(node)
            rds.pause()  # the index cannot load while the journal gets its replica
            admin = await Conn.open(node.endpoint)
            assert (await admin.apply(spec(J, replication=1))).status == Status.OK
            await admin.close()
            conns = []
            try:
                for _ in range(100):  # bounded: until an append reaches the primary's checks
                    conns.append(conn := await Conn.open(node.endpoint))
                    append = asyncio.ensure_future(conn.append(J, [b"would overwrite 0\n"]))
                    done, _ = await asyncio.wait({append}, timeout=3.0)
                    if not done:
                        break  # held: waiting for the index
                    # Only "no route yet" may come back early — never OK at offset 0
                    # (what a primary without its index did).
                    assert append.result().status in ROUTING, append.result()
                    await asyncio.sleep(0.1)  # the allocator is placing the journal
                else:
                    raise AssertionError("the journal never got a primary")
                rds.resume()
                resp = await asyncio.wait_for(append, 30.0)
            finally:
                for conn in conns:
                    await conn.close()
            assert resp.status == Status.INDEX_HAS_GREATER_OFFSET, resp
        finally:
            if rds.paused:
                rds.resume()
            c.stop_all()
            if not os.environ.get("QUIRE_KEEP_WORKDIR"):
                shutil.rmtree(c.workdir, ignore_errors=True)
