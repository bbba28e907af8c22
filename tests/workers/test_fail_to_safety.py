"""A route rebuilt entirely from members that never held a journal (Gazette's
fail-to-safety), on a real cluster: etcd, coordinators, Redis, a Celery worker and a
file store.

The journal's content is persisted (closed fragments, uploaded by the worker, in the
fragment index); then every member that held it is killed and loses its spool
directory (closed fragments, retired heads, the producer log), Redis loses the index
(as after a restart without persistence), and fresh members take the journal over. Their spools start at 0 while the store holds the journal up to N:
no append may be acknowledged below N (that would fork the journal), the client must
not hang, and the refusal must say which journal, why and what to run. The operator's
`quire journals reset-head` then lets appends continue at N, and the journal reads back
as acknowledged."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from fragment_store import CoverSet
from protocol import FragmentSpec, JournalSpec, Status
from protocol.errors import IndexHasGreaterOffset
from protocol.fragment import Codec
from quire.client.client import Client
from tools.services import CeleryWorkerService, RedisDb

from tests.coordinator.cluster import Cluster, Conn, make_workdir, until, wait_appendable

from .workers_support import REPO, worker_env

pytestmark = pytest.mark.timeout(240)

J = "safety/never-held"
FORMING = (Status.INSUFFICIENT_JOURNAL_BROKERS, Status.NO_JOURNAL_PRIMARY_BROKER,
           Status.NOT_JOURNAL_PRIMARY_BROKER, Status.UNAVAILABLE, Status.JOURNAL_NOT_FOUND)



def index_end(redis_db: RedisDb) -> int:
    raw = redis_db.client.get("quire:index:" + J)
    return CoverSet.from_json(raw).end_offset if raw else 0


async def test_fresh_members_refuse_below_the_index_until_reset_head(
        etcd, etcd_root, redis_db, tmp_path) -> None:  # noqa: ANN001
    store = tmp_path / "store"
    store.mkdir()
    worker = CeleryWorkerService(
        f"w{uuid.uuid4().hex[:6]}", redis_url=redis_db.url, queues=("persist", "index"),
        pool="threads", concurrency=2, env=worker_env(redis_db.url, etcd, etcd_root, None))
    c = Cluster(etcd.url, etcd_root, make_workdir(), extra=["--redis", redis_db.url])
    old = [c.add(f"zone-{i}", f"old-{i}") for i in range(2)]
    try:
        worker.start()
        for n in old:
            c.start(n)
        for n in old:
            await c.wait_listening(n)
        conn = await Conn.open(old[0].endpoint)
        spec = JournalSpec(name=J, replication=2, fragment=FragmentSpec(
            length=1024, compression_codec=Codec.NONE, stores=(store.as_uri() + "/",)))
        assert (await conn.apply(spec)).status == Status.OK
        assert (await wait_appendable(old[0].endpoint, J)).status == Status.OK
        # 600-byte records: a spool past 1024 bytes rolls at the start of the next append
        # (the closing zero-byte one too), so every acknowledged byte is in a closed
        # fragment, which the primary hands to the worker at once.
        records = [bytes([65 + i]) * 599 + b"\n" for i in range(4)]
        for r in records:
            resp = await conn.append(J, [r])
            assert resp.status == Status.OK, resp
        assert (await conn.append(J, [])).status == Status.OK
        await conn.close()
        content = b"".join(records)
        end = len(content)
        await until(lambda: index_end(redis_db) == end, 60, "the content persisted and indexed")

        # Every member that held the journal is gone, with its spool directory.
        for n in old:
            c.kill(n, signal.SIGKILL)
            n.proc.wait(10)
            shutil.rmtree(n.spool_dir, ignore_errors=True)
        # And Redis lost the index (restarted without persistence; the workers have not
        # listed the store again yet): the fresh members must learn it from the store.
        redis_db.client.delete("quire:index:" + J)
        redis_db.client.hdel("quire:index-refreshed", J)
        fresh = [c.add(f"zone-{i}", f"fresh-{i}") for i in range(2)]
        for n in fresh:
            c.start(n)
        for n in fresh:
            await c.wait_listening(n)

        # Until the route is rebuilt from the fresh members, only "no route yet"; then
        # the refusal — never OK (an offset below `end` written again), never a hang.
        seen: list[Status] = []
        deadline = time.monotonic() + 60
        while True:
            probe = await Conn.open(fresh[0].endpoint)
            try:
                resp = await asyncio.wait_for(probe.append(J, [b"would be written at 0\n"]), 40)
            finally:
                await probe.close()
            seen.append(resp.status)
            assert resp.status != Status.OK, (resp, seen)
            if resp.status not in FORMING:
                break
            assert time.monotonic() < deadline, f"the route never formed: {seen}"
            await asyncio.sleep(0.2)  # the allocator is moving the journal
        assert resp.status == Status.INDEX_HAS_GREATER_OFFSET, resp
        words = resp.message
        assert f"journal {J}" in words, words
        assert "ever held it" in words and f"up to offset {end}" in words, words
        assert f"quire journals reset-head -j {J}" in words, words
        assert "fresh-0" in words and "fresh-1" in words, words  # the route's members

        # The client raises it at once (a definite refusal), with the same words.
        qc = Client([n.endpoint for n in fresh], retry_timeout=30)
        try:
            with pytest.raises(IndexHasGreaterOffset) as refused:
                await asyncio.wait_for(qc.append(J, b"refused\n"), 30)
            assert "reset-head" in str(refused.value) and str(end) in str(refused.value)

            # The operator's command clears it: appends continue at the index's end.
            env = {**os.environ, "QUIRE_BROKER": fresh[1].endpoint, "PYTHONPATH": str(REPO)}
            out = subprocess.run([sys.executable, "-m", "tools.cli.main", "journals", "reset-head",
                                  "-j", J, "-o", "json"], capture_output=True, env=env, timeout=90)
            assert out.returncode == 0, out.stderr.decode()
            assert json.loads(out.stdout)["write_head"] == end
            after = await qc.append(J, b"after reset-head\n")
            assert (after.begin, after.end) == (end, end + len(b"after reset-head\n"))
            got = bytearray()
            async for _, data in qc.read(J, 0, end_offset=after.end):
                got += data
            assert bytes(got) == content + b"after reset-head\n"
        finally:
            await qc.close()
    finally:
        c.stop_all()
        worker.close()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(c.workdir, ignore_errors=True)
