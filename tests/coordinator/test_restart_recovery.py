"""A coordinator restart re-queues the closed fragments it left on disk, and reports
spool bytes (quire_spool_bytes) from its metrics endpoint."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import time
from pathlib import Path

import msgspec
import pytest

from protocol import FragmentSpec, JournalSpec, Status
from protocol.fragment import Codec, Fragment
from tools.services import free_port

from .cluster import Cluster, Conn, make_workdir, scrape_metric, wait_appendable

pytestmark = pytest.mark.timeout(120)

J = "recover/j"


def _metric(port: int, name: str) -> float:
    value = scrape_metric(port, name)
    assert value is not None, f"{name} not exported"
    return value


def _queued_fragments(client) -> list[Fragment]:  # noqa: ANN001
    """Fragments of the persist tasks waiting in Redis (kombu's JSON envelope)."""
    out = []
    for raw in client.lrange("persist", 0, -1):
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        out.append(msgspec.convert(body[1]["fragment"], Fragment))
    return out


async def _until(pred, timeout: float = 30.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)  # polling another process's observable state


async def test_restart_requeues_closed_fragments(etcd, etcd_root, redis_db) -> None:  # noqa: ANN001
    mport = free_port()
    c = Cluster(etcd.url, etcd_root, make_workdir(),
                extra=["--redis", redis_db.url, "--metrics-port", str(mport)])
    node = c.add("zone-0", "node-0")
    store = Path(c.workdir) / "store"
    store.mkdir()
    try:
        c.start(node)
        await c.wait_listening(node)
        conn = await Conn.open(node.endpoint)
        spec = JournalSpec(name=J, replication=1, fragment=FragmentSpec(
            length=1024, compression_codec=Codec.NONE, stores=(f"file://{store}/",)))
        assert (await conn.apply(spec)).status == Status.OK
        assert (await wait_appendable(node.endpoint, J)).status == Status.OK
        for _ in range(5):  # rolls at the start of an append once past 1024 bytes
            assert (await conn.append(J, [b"a" * 600])).status == Status.OK
        await conn.close()
        assert _metric(mport, "quire_spool_bytes") == 3000
        spans = lambda: sorted((f.begin, f.end) for f in _queued_fragments(redis_db.client))  # noqa: E731
        closed = await _until(lambda: len(spans()) >= 2 and spans())
        assert closed == [(0, 1200), (1200, 2400)]

        # Crash before any worker ran; the tasks are lost too (Redis keeps none here).
        c.kill(node, signal.SIGKILL)
        node.proc.wait(10)
        redis_db.client.delete("persist")
        # Restart at once, while the dead member's key (--lease-ttl 3) still exists:
        # the new incarnation keeps its own lease alive while it waits for that key.
        c.start(node)
        await c.wait_listening(node)
        assert node.proc.poll() is None, c.tail(node)
        again = await _until(lambda: len(spans()) >= 2 and _queued_fragments(redis_db.client))
        assert sorted((f.begin, f.end) for f in again) == closed
        assert all(f.journal == J and len(f.sum) == 40 for f in again)
        assert _metric(mport, "quire_spool_bytes") == 2400  # the open spool's bytes were dropped
        # The recovered fragments still say how far the journal was written: an append
        # must not start over at offset 0 (that would write offsets twice).
        conn = await Conn.open(node.endpoint)
        r = await conn.append(J, [b"b"])
        assert r.status == Status.INDEX_HAS_GREATER_OFFSET, r
        await conn.close()

        # The index workers report them persisted: the files go.
        raws = lambda: sorted(p.name for p in Path(node.spool_dir).rglob("*.raw"))  # noqa: E731
        assert len(raws()) == 2
        redis_db.client.set("quire:index:" + J, msgspec.json.encode(tuple(again)))
        redis_db.client.publish("quire:index-updates", J)
        assert await _until(lambda: not raws()), raws()
        assert _metric(mport, "quire_spool_bytes") == 0
    finally:
        c.stop_all()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(c.workdir, ignore_errors=True)
