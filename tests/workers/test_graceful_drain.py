"""Graceful drain on SIGTERM (coordinator/drain.py) with real Redis, a real Celery
worker and a file store: the only coordinator (R=1) is stopped while its spool holds
content that was never rolled, then started again on the same spool directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fragment_store import CoverSet, list_fragments, open_store
from quire.client.client import Client
from protocol import FragmentSpec, JournalSpec
from tools.services import free_port

from tests.coordinator.cluster import until

from .workers_support import appendable, coordinator

pytestmark = pytest.mark.timeout(180)

J = "acme/drain/part-000"


async def _read(qc: Client, end: int) -> bytes:
    out = bytearray()
    async for _, data in qc.read(J, 0, end_offset=end):
        out += data
        if len(out) >= end:
            break
    return bytes(out)


async def _read_or_none(qc: Client, end: int) -> bytes | None:
    try:
        async with asyncio.timeout(10):
            return await _read(qc, end)
    except Exception:  # noqa: BLE001 - not assigned (or not synced) yet after the restart
        return None


async def test_sigterm_rolls_persists_and_a_restart_appends_on(
        start_worker, etcd, etcd_root, redis_db, file_store, tmp_path: Path) -> None:
    start_worker(queues=("persist", "index", "celery"))
    port = free_port()
    spool = tmp_path / "spool"
    coord = coordinator("coord-d", etcd=etcd, root=etcd_root, redis_url=redis_db.url,
                        spool_dir=str(spool), port=port, extra=("--drain-timeout", "30"))
    coord.stop_timeout = 45.0  # more than the drain bound: SIGKILL only if it hangs
    coord.start()
    qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
    try:
        # 1 MiB fragments: nothing rolls while appending, so every byte is in the spool.
        await qc.apply([JournalSpec(name=J, replication=1, fragment=FragmentSpec(
            length=1 << 20, compression_codec="none", stores=(file_store,)))])
        await until(lambda: appendable(qc, J), 30, "the journal to accept appends")
        records = [b"record %03d\n" % i * 7 for i in range(20)]
        results = [await qc.append(J, r) for r in records]
        content, end = b"".join(records), results[-1].end
        assert end == len(content)
        store = open_store(file_store)
        assert not list_fragments(store, J)  # nothing was ever rolled
        await qc.close()

        assert coord.stop() == 0, coord.log_tail()  # a graceful exit, within the drain bound

        # Before it withdrew, the spool was rolled and persisted, and the index says so.
        persisted = list_fragments(store, J)
        assert [(f.begin, f.end) for f in persisted] == [(0, end)]
        indexed = CoverSet.from_json(redis_db.client.get(f"quire:index:{J}"))
        assert indexed.end_offset == end
        assert not list(spool.rglob("*.spool"))
        assert (spool / J / ".head.json").exists()  # where the next incarnation resumes

        coord.start()
        qc = Client([f"127.0.0.1:{port}"], retry_timeout=30)
        got = await until(lambda: _read_or_none(qc, end), 60, "the content after the restart")
        assert got == content
        # A plain append continues at the write head: no INDEX_HAS_GREATER_OFFSET, no
        # reset-head, and no offset written twice.
        again = await qc.append(J, b"after the restart\n")
        assert (again.begin, again.end) == (end, end + len(b"after the restart\n"))
        assert await _read(qc, again.end) == content + b"after the restart\n"
        assert not (spool / J / ".head.json").exists()  # consumed by the new replica
    finally:
        await qc.close()
        coord.close()
