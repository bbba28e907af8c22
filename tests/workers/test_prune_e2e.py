"""Pruning against a live journal: a real coordinator, Celery workers, Redis, etcd and S3.

What the unit-level prune tests (test_workers_prune.py) cannot show: that a reader of the
live journal asking for a pruned offset is moved to the first retained byte (an offset
jump, as for any gap) rather than failing on a missing object, and that a fragment whose
upload was cut short by a killed worker is never touched by a prune run.
"""

from __future__ import annotations

import asyncio
import os
import time

import msgspec

from fragment_store import CoverSet, fragment_key
from protocol import FragmentSpec, JournalSpec
from quire.client.client import Client
from tools.services import free_port, wait_for

from .fragment_server import FragmentServer, make_fragment
from .test_workers_e2e import until
from .test_workers_index import put_fragment, s3_store
from .test_workers_prune import put_retained_journal, run
from .workers_support import appendable, coordinator, s3_url

J = "acme/e2e/pruned"


async def test_reader_from_zero_jumps_to_the_first_retained_byte_after_prune(
        start_worker, client, env, etcd, etcd_root, s3, s3_bucket, redis_db, tmp_path) -> None:
    url = s3_url(s3_bucket, "prune-e2e/")
    store = s3_store(s3, url)
    port = free_port()
    coord = coordinator("coord-p", etcd=etcd, root=etcd_root, redis_url=redis_db.url,
                        spool_dir=str(tmp_path / "spool"), port=port, metrics_port=free_port(),
                        env={k: v for k, v in env.items() if k.startswith("QUIRE_S3")})
    coord.start()
    qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
    try:
        await qc.apply([JournalSpec(name=J, replication=1, fragment=FragmentSpec(
            length=1024, compression_codec="gzip", stores=(url,), refresh_interval=1.0,
            retention=2.0))])
        await until(lambda: appendable(qc, J), 30, "the journal to accept appends")
        start_worker(queues=("persist", "index", "pulse", "prune"))
        # Each 3,000-byte append rolls the one before (length 1,024): three fragments.
        parts = [os.urandom(3000) for _ in range(3)]
        acks = [await qc.append(J, p) for p in parts]
        client.send_task("workers.pulse.pulse_journal", args=[J], queue="pulse")

        def persisted() -> list[tuple[int, int]]:
            raw = redis_db.client.get(f"quire:index:{J}")
            return [(f.begin, f.end) for f in CoverSet.from_json(raw)] if raw else []
        want = [(a.begin, a.end) for a in acks]
        await until(lambda: persisted() == want, 60, "all three fragments to be persisted")
        newest = max(store.stat(k.key).mod_time for k in store.list(J + "/"))
        await until(lambda: time.time() > newest + 2.5, 10, "the fragments to age")

        result = await asyncio.to_thread(run, client, J)
        # The newest persisted fragment holds the head: it stays, however old.
        assert [(r["begin"], r["end"]) for r in result["removed"]] == want[:2]
        assert result["first_retained"] == acks[2].begin
        assert [i.key.split("/")[-1][:33] for i in store.list(J + "/")] == [
            f"{acks[2].begin:016x}-{acks[2].end:016x}"]
        await until(lambda: persisted() == want[2:], 30, "the index to drop pruned fragments")

        async def read_from_zero() -> tuple[int, bytes, int]:
            reader = qc.read(J, 0, end_offset=acks[2].end)
            got = bytearray()
            first = -1
            async for offset, data in reader:
                first = offset if first < 0 else first
                got += data
                if first + len(got) >= acks[2].end:
                    break
            return first, bytes(got), reader.offset_jumps

        first, got, jumps = await until(lambda: _or_none(read_from_zero()), 60,
                                        "a read from offset 0 after the prune")
        assert (first, got, jumps) == (acks[2].begin, parts[2], 1)
    finally:
        await qc.close()
        coord.close()



async def _or_none(coro):  # type: ignore[no-untyped-def]
    """The read's result, or None while the coordinator still offers a pruned fragment
    (its index watch lags the prune by up to one refresh)."""
    try:
        return await asyncio.wait_for(coro, 10)
    except Exception:  # noqa: BLE001 - retried by `until`
        return None


def test_a_fragment_whose_upload_was_killed_is_never_pruned(
        start_worker, client, etcd, etcd_root, s3, s3_bucket) -> None:
    url = s3_url(s3_bucket, "prune-kill/")
    store = s3_store(s3, url)
    j = "acme/pruned-midway"
    old = [put_fragment(store, j, b, b"o" * 100) for b in (0, 100)]
    # The next fragment, [200, 200 + 24 MiB), is being persisted by a worker that is
    # killed mid-upload (the first multipart part is in; the object is not).
    data = os.urandom(24 << 20)
    inflight = make_fragment(j, 200, data, codec="none")
    slow = FragmentServer(rate=8 << 20).start()
    try:
        slow.add(inflight, data)
        put_retained_journal(etcd, etcd_root, j, url, retention=2.0)
        # 60 s: w1 never restores (and redelivers to itself) its own in-flight task
        # before the kill, however slow a loaded machine makes the upload.
        w1 = start_worker(queues=("persist",), QUIRE_WORKER_VISIBILITY_TIMEOUT="60")
        client.send_task("workers.persist.persist_fragment", kwargs={
            "fragment": msgspec.to_builtins(inflight), "endpoints": [slow.endpoint],
            "store": url}, queue="persist")
        wait_for(lambda: slow.bytes_served >= 18 << 20, timeout=30,
                 what="the upload to be underway")
        w1.kill()
        newest = max(f.mod_time for f in old)
        wait_for(lambda: time.time() > newest + 2.5, timeout=10, what="the old fragments to age")

        start_worker(queues=("prune", "index"))
        first = run(client, j)
        # Only persisted fragments are candidates; the one holding the persisted head
        # stays; the half-uploaded fragment is not in the store and is not planned.
        assert [(r["begin"], r["end"]) for r in first["removed"]] == [(0, 100)]
        assert [i.key for i in store.list(j + "/")] == [fragment_key(old[1])]

        # A new persist worker finishes the abandoned upload; the next prune keeps it
        # (it holds the head) and removes what it now may.
        slow.rate = 0
        start_worker(queues=("persist",), QUIRE_WORKER_VISIBILITY_TIMEOUT="15")
        wait_for(lambda: store.exists(fragment_key(inflight)), timeout=90, interval=0.25,
                 what="the redelivered upload to land")
        wait_for(lambda: time.time() > store.stat(fragment_key(old[1])).mod_time + 2.5,
                 timeout=10, what="the second fragment to age")
        second = run(client, j)
        assert [(r["begin"], r["end"]) for r in second["removed"]] == [(100, 200)]
        assert [i.key for i in store.list(j + "/")] == [fragment_key(inflight)]
    finally:
        slow.stop()
