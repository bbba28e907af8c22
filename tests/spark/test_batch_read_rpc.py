"""Journals written through real coordinators (appends), persisted by a real Celery
worker: the bytes and offsets Spark and Dask read from the store equal what the
coordinator's Read RPC serves for the same range."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.batch_corpus import StoreUnderTest, expected_messages, json_lines
from tests.spark.test_batch_dask import dask_messages
from tests.spark.test_batch_spark import spark_messages

pytestmark = pytest.mark.spark

JOURNALS = {"rpc/clicks/part-000": "gzip", "rpc/clicks/part-001": "zstd",
            "rpc/clicks/part-002": "snappy"}


def _persisted_end(store: Any, journal: str) -> int:
    """End of the contiguous persisted content from offset 0."""
    from fragment_store import CoverSet, list_fragments

    end = 0
    for f in CoverSet(list_fragments(store, journal)):
        if f.begin > end:
            break
        end = max(end, f.end)
    return end


def test_read_rpc_spark_and_dask_agree(quire_spark: Any, tmp_path: Path) -> None:
    chaos_cluster = pytest.importorskip("chaos.cluster")
    client_mod = pytest.importorskip("quire.client")
    from protocol import Codec, FragmentSpec, JournalSpec, LabelSet

    sut = StoreUnderTest(url=f"file://{tmp_path}/store/", options={}, kind="file")
    store = sut.store()
    rng = random.Random(11)
    contents: dict[str, bytes] = {}
    with chaos_cluster.LocalCluster(n=1, worker=True, workdir=tmp_path / "cluster") as cluster:
        client = client_mod.SyncClient(cluster.endpoints)
        try:
            client.apply([JournalSpec(
                name=j, replication=1, labels=LabelSet.of(topic="clicks"),
                fragment=FragmentSpec(length=1 << 10, compression_codec=Codec(codec),
                                      stores=(sut.url,), refresh_interval=1.0))
                for j, codec in JOURNALS.items()])
            for j in JOURNALS:
                content = json_lines(rng, 120, long_every=17)
                # Appends of a few messages each; the spool rolls past 1 KiB, so
                # fragments end wherever an append crossed the length.
                lines = content.splitlines(keepends=True)
                i = 0
                while i < len(lines):
                    n = rng.randrange(1, 6)
                    deadline = time.monotonic() + 30
                    while True:
                        try:
                            client.append(j, b"".join(lines[i:i + n]))
                            break
                        except Exception:  # noqa: BLE001 - the journal may not be assigned yet
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.2)
                    i += n
                contents[j] = content
            # Wait until the worker persisted most of each journal (the open spool stays).
            deadline = time.monotonic() + 90
            ends = {}
            while time.monotonic() < deadline:
                ends = {j: _persisted_end(store, j) for j in JOURNALS}
                if all(e >= len(contents[j]) // 2 for j, e in ends.items()):
                    break
                time.sleep(0.5)
            assert all(e > 0 for e in ends.values()), ends
            end = min(ends.values())
            begin = 100  # mid-message: every reader trusts the requested begin
            via_rpc = {}
            for j in JOURNALS:
                data = client.read_all(j, begin, end_offset=end)
                assert data == contents[j][begin:end]
                via_rpc[j] = expected_messages(contents[j][:end], begin, end)
        finally:
            client.close()
    via_spark = spark_messages(quire_spark, sut, selector="prefix=rpc/clicks/",
                               begin=begin, end=end)
    via_dask = dask_messages(sut, selector="prefix=rpc/clicks/", begin=begin, end=end)
    # The readers finish the last message past `end` from the store; the RPC bytes
    # stop at `end`, so compare the messages wholly inside [begin, end).
    for j in JOURNALS:
        whole = [(o, v) for o, v in via_rpc[j] if o + len(v) < end]
        assert via_spark[j][:len(whole)] == whole
        assert via_dask[j][:len(whole)] == whole
        assert [o for o, _ in via_spark[j]] == [o for o, _ in via_dask[j]]
        assert via_spark[j] == via_dask[j]
