"""The Spark streaming source over rotten persisted fragments (a real cluster: the
session's stream_cluster, a coordinator and a worker persisting to a file store): with
the good copies in another store the query's rows are the journal's, the rotten objects
are mended; without, the query fails naming the fragment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fragment_store import (
    FileStore,
    fragment_key,
    fragment_name,
    list_fragments,
    open_store,
    persist_fragment,
    read_fragment,
    verify_stored,
)
from protocol import Codec, FragmentSpec, JournalSpec
from tests.fragment_store.rot import flip_byte
from tests.spark.stream_helpers import append_messages, persisted_end, wait_for

pytestmark = pytest.mark.spark

SCHEMA = "journal string, offset bigint, value string, fragment string, n bigint"
N = 120


def _query(spark: Any, cluster: Any, journal: str, out: str, ck: str, **options: str) -> Any:
    return (spark.readStream.format("quire").option("store", cluster.store_url)
            .option("brokers", ",".join(cluster.endpoints)).option("journal", journal)
            .options(**options).schema(SCHEMA).load()
            .writeStream.format("parquet").option("path", out)
            .option("checkpointLocation", ck).start())


def test_stream_reads_good_copies_or_fails(quire_spark: Any, stream_cluster: Any,
                                           tmp_path: Path) -> None:
    from quire.client import SyncClient

    cluster, store_url = stream_cluster, stream_cluster.store_url
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    journals = {"integrity-stream/copy": Codec.NONE, "integrity-stream/alone": Codec.ZSTANDARD}
    with SyncClient(cluster.endpoints) as client:
        client.apply([JournalSpec(name=j, replication=1, fragment=FragmentSpec(
            length=2048, compression_codec=codec, stores=(store_url, backup.url),
            refresh_interval=1.0)) for j, codec in journals.items()])
        client.wait_writable(list(journals))
        for j in journals:
            append_messages(client, j, 0, N)
        wait_for(lambda: all(persisted_end(store_url, j) > 4096 for j in journals),
                 what="several fragments persisted")
    store = open_store(store_url)
    rotten: dict[str, list[Any]] = {}
    for j in journals:
        frags = [f for f in list_fragments(store, j) if f.end <= persisted_end(store_url, j)]
        for f in frags:
            if j.endswith("copy"):
                persist_fragment(backup, f, b"".join(read_fragment(store, f)))
            flip_byte(store, fragment_key(f))
        rotten[j] = frags

    j = "integrity-stream/copy"
    q = _query(quire_spark, cluster, j, str(tmp_path / "out"), str(tmp_path / "ck"),
               fallbackStores=backup.url)
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    rows = quire_spark.read.parquet(str(tmp_path / "out")).select("journal", "n", "fragment").collect()
    assert sorted(r.n for r in rows) == list(range(N))
    assert any(r.fragment for r in rows)  # some rows came from the (mended) store
    assert all(verify_stored(store, f) == "" for f in rotten[j])

    j = "integrity-stream/alone"
    q = _query(quire_spark, cluster, j, str(tmp_path / "out2"), str(tmp_path / "ck2"))
    with pytest.raises(Exception) as err:  # noqa: PT011 - Spark wraps the executor's error
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert "FragmentCorrupt" in str(err.value)
    assert any(fragment_name(f) in str(err.value) for f in rotten[j])
