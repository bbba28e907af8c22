"""End to end with real coordinators: append -> roll -> persist -> index -> drop -> cold read.

A real coordinator process (`python -m coordinator.main --redis …`), a real Celery
worker, real Redis, etcd and the S3 server (or a file store).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time

import pytest

from fragment_store import CoverSet, fragment_key, open_store, read_fragment
from quire.client.client import Client
from protocol import FragmentSpec, JournalSpec
from tools.services import free_port

from tests.coordinator.cluster import until

from .workers_support import appendable, coordinator, s3_url, scrape

J = "acme/e2e/part-000"


@pytest.mark.parametrize("kind", ["s3", "file"])
async def test_append_roll_persist_index_drop_and_cold_read(
        kind, start_worker, client, env, etcd, etcd_root, s3, s3_bucket, redis_db,
        tmp_path, monkeypatch) -> None:
    store_url = s3_url(s3_bucket, "e2e/") if kind == "s3" else (tmp_path / "store").as_uri() + "/"
    coord_env = {k: v for k, v in env.items() if k.startswith("QUIRE_S3")}
    port, metrics_port = free_port(), free_port()
    spool = tmp_path / "spool"
    coord = coordinator("coord-a", etcd=etcd, root=etcd_root, redis_url=redis_db.url,
                        spool_dir=str(spool), port=port, metrics_port=metrics_port, env=coord_env)
    coord.start()
    qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
    try:
        await qc.apply([JournalSpec(name=J, replication=1, fragment=FragmentSpec(
            length=1024, compression_codec="gzip", stores=(store_url,), refresh_interval=1.0))])
        await until(lambda: appendable(qc, J), 30, "the journal to accept appends")

        a = os.urandom(3000)
        b = b"line\n" * 600
        ra = await qc.append(J, a)
        rb = await qc.append(J, b)  # rolls [.., end of a) first: length 3000 > 1024
        first = (ra.begin, ra.end)
        hashes = {first: hashlib.sha1(a).hexdigest()}

        # No worker yet: the closed fragment waits on local disk and the lag shows it.
        lag = await until(lambda: scrape(metrics_port, "quire_persist_lag_bytes"), 10, "lag metric")
        assert lag == {f'{{journal="{J}"}}': 3000.0}

        start_worker(queues=("persist", "index", "pulse"))
        store = open_store(store_url, **({"endpoint": s3.url, "access_key": s3.access_key,
                                          "secret_key": s3.secret_key} if kind == "s3" else {}))
        frag_a = CoverSet.from_json(await until(
            lambda: redis_db.client.get(f"quire:index:{J}"), 60, "the index in Redis"))[0]
        assert (frag_a.begin, frag_a.end, frag_a.sum) == (*first, hashes[first])
        assert fragment_key(frag_a) == f"{J}/{frag_a.begin:016x}-{frag_a.end:016x}-{frag_a.sum}.gz"
        assert store.exists(fragment_key(frag_a))
        assert b"".join(read_fragment(store, frag_a)) == a

        # The coordinator merged the index and dropped its local copy.
        async def dropped():
            infos = await qc.list_fragments(J)
            return [(i.spec.begin, i.spec.end, i.local) for i in infos if i.spec.begin == ra.begin]
        assert await until(dropped, 30, "the local copy to be dropped") == [(ra.begin, ra.end, False)]
        await until(lambda: not scrape(metrics_port, "quire_persist_lag_bytes"), 10, "lag back to 0")

        # A pulse (zero-byte append through the worker) rolls the over-length spool of b.
        client.send_task("workers.pulse.pulse_journal", args=[J], queue="pulse")
        await until(lambda: len(CoverSet.from_json(redis_db.client.get(f"quire:index:{J}"))) == 2,
                    60, "the second fragment to be persisted")

        # A cold coordinator: same member, restarted with an empty spool directory.
        coord.stop()
        shutil.rmtree(spool)
        coord.start()
        cold = Client([f"127.0.0.1:{port}"], retry_timeout=30)
        try:
            got = await until(lambda: _read_or_none(cold, ra.begin, rb.end), 60, "a cold read")
            assert got == a + b
        finally:
            await cold.close()
        assert not list(spool.rglob("*.spool"))  # served from the store, not from disk
    finally:
        await qc.close()
        coord.close()



async def _read_or_none(c: Client, begin: int, end: int) -> bytes | None:
    try:
        return await asyncio.wait_for(read_range_on(c, begin, end), 10)
    except Exception:  # noqa: BLE001 - not assigned yet after the restart
        return None


async def read_range_on(c: Client, begin: int, end: int) -> bytes:
    out = bytearray()
    async for offset, data in c.read(J, begin, end_offset=end):
        out += data
        if begin + len(out) >= end:
            break
    return bytes(out)


async def test_redis_outage_appends_and_reads_continue_then_persistence_catches_up(
        start_worker, env, etcd, etcd_root, tmp_path) -> None:
    from tools.services import RedisService

    store_url = (tmp_path / "store").as_uri() + "/"
    port, metrics_port = free_port(), free_port()
    with RedisService("redis-outage") as rds:
        coord = coordinator("coord-r", etcd=etcd, root=etcd_root, redis_url=rds.url,
                            spool_dir=str(tmp_path / "spool"), port=port, metrics_port=metrics_port)
        coord.start()
        qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
        try:
            start_worker(queues=("persist", "index"), redis_url=rds.url)
            await qc.apply([JournalSpec(name=J, replication=1, fragment=FragmentSpec(
                length=1024, compression_codec="zstd", stores=(store_url,), refresh_interval=1.0))])
            await until(lambda: appendable(qc, J), 30, "the journal to accept appends")

            rds.stop()
            written = b""
            for i in range(4):  # each append rolls the previous (over-length) fragment
                chunk = bytes([65 + i]) * 2000
                t0 = time.monotonic()
                await qc.append(J, chunk)
                assert time.monotonic() - t0 < 5, "an append waited on Redis"
                written += chunk
            assert await read_range_on(qc, 0, len(written)) == written
            lag = await until(lambda: scrape(metrics_port, "quire_persist_lag_bytes"), 10, "lag")
            assert lag[f'{{journal="{J}"}}'] == 6000.0  # three closed fragments wait locally
            await until(lambda: scrape(metrics_port, "quire_persist_broker_up") == {"": 0.0},
                        20, "the persister to notice Redis is gone")

            rds.start()  # empty: whatever was queued before is gone; the persister re-sends
            await until(lambda: not scrape(metrics_port, "quire_persist_lag_bytes"), 90,
                        "persistence to catch up")
            cover = CoverSet.from_json(rds.client().get(f"quire:index:{J}"))
            assert cover.end_offset == 6000 and not cover.gaps()
            store = open_store(store_url)
            assert b"".join(b"".join(read_fragment(store, f)) for f in cover) == written[:6000]
        finally:
            await qc.close()
            coord.close()
