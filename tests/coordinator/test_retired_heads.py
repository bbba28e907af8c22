"""A replica retired and forgotten (nothing unpersisted left) leaves its write head
behind: when the journal is assigned here again, the fresh replica resumes there,
as after a graceful exit, instead of synchronizing at 0 and refusing every append
with INDEX_HAS_GREATER_OFFSET until an operator's reset-head.

Chaos showed the need: etcd paused past the lease TTL expires every member's lease at
once, every route is rebuilt, and every member had retired — and, its content
persisted, forgotten — its replicas of a consumer's recovery log."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from protocol import ApplyChange, ApplyRequest, ApplyResponse, Status
from protocol.fragment import Codec, Fragment
from tools.services import free_port

from .cluster import Conn, running, scrape_metric, serve_journal, spec, wait_appendable

pytestmark = pytest.mark.timeout(120)

J, OTHER = "retired/j", "retired/other"


def _replicas(port: int) -> float:
    value = scrape_metric(port, "quire_replicas")
    assert value is not None, "quire_replicas not exported"
    return value


async def _until(pred, what: str, timeout: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)  # another process's observable state


async def test_a_journal_assigned_again_resumes_at_the_forgotten_replicas_head(
        etcd, etcd_root, redis_db) -> None:  # noqa: ANN001
    mport = free_port()
    with running(etcd.url, etcd_root, 1,
                 extra=["--redis", redis_db.url, "--metrics-port", str(mport)]) as c:
        node = c.nodes[0]
        await serve_journal(c, J, replication=1)
        conn = await Conn.open(node.endpoint)
        r = await conn.append(J, [b"written before the journal went away\n"])
        assert r.status == Status.OK, r
        end = r.commit.end

        # The journal's assignment goes away: the replica retires (closes its spool for
        # persistence) and is kept while its fragment is not persisted.
        await conn.s.send(ApplyRequest(changes=(ApplyChange(delete=J, expect_mod_revision=-1),)))
        msg, _ = await asyncio.wait_for(conn.s.read_message(ApplyResponse), 30.0)
        assert msg.status == Status.OK
        # The index workers report it persisted; the next look at the keyspace (another
        # journal applied) forgets the replica.
        persisted = Fragment(journal=J, begin=0, end=end, sum="f" * 40, codec=Codec.NONE,
                             backing_store="file:///nowhere/")
        redis_db.client.set("quire:index:" + J, msgspec.json.encode((persisted,)))
        redis_db.client.publish("quire:index-updates", J)
        assert (await conn.apply(spec(OTHER, replication=1))).status == Status.OK
        assert (await wait_appendable(node.endpoint, OTHER)).status == Status.OK
        await _until(lambda: _replicas(mport) == 1, "the retired replica to be forgotten")

        # Assigned here again: the append continues at the head, not refused.
        assert (await conn.apply(spec(J, replication=1))).status == Status.OK
        resp = await wait_appendable(node.endpoint, J)
        assert resp.status == Status.OK, resp
        r = await conn.append(J, [b"and after\n"])
        assert r.status == Status.OK and r.commit.begin == end, r
        await conn.close()
