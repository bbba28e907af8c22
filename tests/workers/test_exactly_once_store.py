"""Exactly-once appends survive a kill -9 of every replica when the transactions' bytes
live only in the store (issue 17, part (3) "from its spool dir and the store").

The scenario of tests/coordinator/test_exactly_once_crash.py on coordinators with Redis,
a real Celery worker persisting fragments to a file store, and the index: before the
kill, every sealed fragment is persisted and its local copy dropped on every replica,
so no `.raw` file is left to count as a seal — only the marks logs' `Sealed` records
keep the producer tables, and only the store holds the bytes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fragment_store import list_fragments, open_store
from protocol import FragmentSpec, JournalSpec
from tests.coordinator.cluster import running
from tests.coordinator.test_exactly_once_crash import crash_every_replica_and_resend

pytestmark = pytest.mark.timeout(180)

J = "eo/crash-store"


async def test_kill9_of_every_replica_with_the_bytes_only_in_the_store(
        start_worker, etcd, etcd_root, redis_db, file_store, tmp_path: Path) -> None:  # noqa: ANN001
    start_worker(queues=("persist", "index", "celery"))
    spec = JournalSpec(name=J, replication=3, fragment=FragmentSpec(
        length=2048, compression_codec="none", stores=(file_store,), refresh_interval=1.0))

    async def persisted_and_dropped(sealed: int) -> None:
        """Every sealed fragment is in the store, and no replica keeps a local copy."""
        store = open_store(file_store)
        deadline = time.monotonic() + 90
        while True:
            covered = max((f.end for f in list_fragments(store, J)), default=0)
            local = [p for n in c.nodes for p in Path(n.spool_dir, J).glob("*.raw")]
            if covered >= sealed and not local:
                return
            assert time.monotonic() < deadline, (covered, sealed, local)
            await asyncio.sleep(0.2)  # the worker and the index refresh run elsewhere

    with running(etcd.url, etcd_root, 3, ["--redis", redis_db.url]) as c:
        await crash_every_replica_and_resend(c, spec, tmp_path / "producers",
                                             before_kill=persisted_and_dropped)
