"""The streaming source against a real cluster (coordinator, Celery worker persisting to
a file store) in Spark local mode: a query over a selector reads while writers append,
is stopped and restarted from its checkpoint, picks up a journal created meanwhile, and
its output is exactly the input — from the store for persisted fragments and from the
coordinator for the tail. Bad options fail at query start."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.spark.stream_helpers import append_messages, make_journals, persisted_end, wait_for

pytestmark = pytest.mark.spark

SCHEMA = "journal string, offset bigint, value string, fragment string, n bigint"


def _stream(spark: Any, cluster: Any, **options: str) -> Any:
    return (spark.readStream.format("quire").option("store", cluster.store_url)
            .option("brokers", ",".join(cluster.endpoints)).options(**options))


def test_stream_restart_from_checkpoint_reads_each_message_once(
        quire_spark: Any, stream_cluster: Any, tmp_path: Path) -> None:
    from quire.client import SyncClient

    cluster, store = stream_cluster, stream_cluster.store_url
    journals = [f"stream/orders/part-{i:03d}" for i in range(3)]
    out, ck = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    sent: dict[str, int] = {}
    with SyncClient(cluster.endpoints) as client:
        make_journals(client, store, journals, topic="orders")

        def write(first: int, count: int, names: list[str]) -> threading.Thread:
            def run() -> None:
                for j in names:
                    append_messages(client, j, first, count)
                    sent[j] = first + count
            t = threading.Thread(target=run)
            t.start()
            return t

        write(0, 60, journals).join()
        # Some history is in the store before the query starts; the rest is the tail.
        wait_for(lambda: all(persisted_end(store, j) > 0 for j in journals), what="persistence")

        def start() -> Any:
            return (_stream(quire_spark, cluster, selector="topic=orders",
                            maxBytesPerTrigger="4096")
                    .schema(SCHEMA).load()
                    .writeStream.format("parquet").option("path", out)
                    .option("checkpointLocation", ck).start())

        query = start()
        writer = write(60, 60, journals)  # appends while micro-batches run
        writer.join()
        query.processAllAvailable()
        batches_first = query.lastProgress["batchId"] + 1
        query.stop()

        write(120, 40, journals).join()  # while the query is down
        late = "stream/orders/part-003"
        make_journals(client, store, [late], topic="orders")  # joins at the next trigger
        query = start()
        writer = write(160, 40, journals + [late])
        writer.join()
        query.processAllAvailable()
        query.stop()

    rows = quire_spark.read.parquet(out).select("journal", "offset", "value", "fragment",
                                                "n").collect()
    got = sorted((r.journal, r.n) for r in rows)
    want = sorted([(j, n) for j in journals for n in range(200)]
                  + [(late, n) for n in range(160, 200)])
    assert got == want  # nothing lost, nothing twice, across the restart
    for r in rows:
        assert json.loads(r.value)["n"] == r.n and json.loads(r.value)["j"] == r.journal
    # Both paths were used: rows from persisted fragments, and tail rows (no fragment).
    assert any(r.fragment for r in rows) and any(r.fragment is None for r in rows)
    assert batches_first > 1  # maxBytesPerTrigger cut the backlog into several batches
    assert sent[late] == 200


def test_unknown_journal_fails_at_query_start(quire_spark: Any, stream_cluster: Any,
                                              tmp_path: Path) -> None:
    df = _stream(quire_spark, stream_cluster, journals="stream/no/such-journal").load()
    with pytest.raises(Exception, match="unknown journal 'stream/no/such-journal'"):
        query = (df.writeStream.format("console")
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


@pytest.mark.parametrize("offsets, match", [
    ('{"stream/aa": -5}', "offset must be an integer >= 0"),
    ('{"stream/aa": 1', "expected earliest, latest or a JSON object"),
    ('[1, 2]', "expected a JSON object"),
    ('{"stream/b": 0}', "journal 'stream/b' is not one of the journals read"),
])
def test_malformed_offsets_map_fails_at_load(quire_spark: Any, stream_cluster: Any,
                                             offsets: str, match: str) -> None:
    with pytest.raises(Exception, match="option 'startingOffsets'") as info:
        _stream(quire_spark, stream_cluster, journals="stream/aa",
                startingOffsets=offsets).load()
    assert match in str(info.value)


def test_starting_offsets_map_and_latest(quire_spark: Any, stream_cluster: Any) -> None:
    from quire.client import SyncClient

    from tests.spark.stream_helpers import message

    journal = "stream/start/part-000"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [journal])
        append_messages(client, journal, 0, 20)  # 3 per append: message 6 starts one
        sixth = sum(len(message(journal, i)) for i in range(6))

        def run(name: str, starting: str, then: Any = None) -> list[int]:
            query = (_stream(quire_spark, stream_cluster, journals=journal,
                             startingOffsets=starting).schema(SCHEMA).load()
                     .writeStream.format("memory").queryName(name).start())
            try:
                query.processAllAvailable()
                if then is not None:
                    then()
                    query.processAllAvailable()
            finally:
                query.stop()
            return sorted(r.n for r in quire_spark.sql(f"select n from {name}").collect())

        assert run("from_map", json.dumps({journal: sixth})) == list(range(6, 20))
        assert run("from_latest", "latest",
                   lambda: append_messages(client, journal, 20, 10)) == list(range(20, 30))


def test_a_deleted_journal_leaves_the_stream_running(quire_spark: Any,
                                                     stream_cluster: Any) -> None:
    from quire.client import SyncClient

    keep, gone = "stream/deleted/keep-000", "stream/deleted/gone-000"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [keep, gone], topic="deleted")
        append_messages(client, keep, 0, 5)
        append_messages(client, gone, 0, 5)
        query = (_stream(quire_spark, stream_cluster, selector="topic=deleted")
                 .schema(SCHEMA).load()
                 .writeStream.format("memory").queryName("deleted_journal").start())
        try:
            query.processAllAvailable()
            client.delete(gone)
            append_messages(client, keep, 5, 5)
            query.processAllAvailable()
            assert query.exception() is None
        finally:
            query.stop()
    rows = quire_spark.sql("select journal, n from deleted_journal").collect()
    assert sorted((r.journal, r.n) for r in rows) == sorted(
        [(keep, n) for n in range(10)] + [(gone, n) for n in range(5)])
