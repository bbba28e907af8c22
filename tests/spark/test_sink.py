"""The sink against a real cluster in Spark local mode: `df.write` of 100k rows comes
back exactly through `quire read`; a task killed mid-write leaves none of its rows;
`writeStream` from one journal into another carries every message once; bad sink
options fail at `.save()`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.stream_helpers import append_messages, make_journals

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def quire_read(cluster: Any, journal: str) -> bytes:
    """The journal's content through the `quire read` command."""
    proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "read", "-j", journal],
                          capture_output=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "QUIRE_BROKER": cluster.endpoints[0]})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.stdout


def _write(df: Any, cluster: Any, **options: str) -> Any:
    return (df.write.format("quire").option("brokers", ",".join(cluster.endpoints))
            .options(**options).mode("append"))


def test_df_write_100k_rows_read_back_exactly(quire_spark: Any, stream_cluster: Any) -> None:
    from quire.client import SyncClient

    journal = "sink/write/part-000"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [journal], length=4 << 20)
    n = 100_000
    df = quire_spark.range(0, n, 1, 4).selectExpr("id as n", "concat('k', id % 7) as key")
    _write(df, stream_cluster, journal=journal).save()
    lines = quire_read(stream_cluster, journal).splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == n
    assert sorted(r["n"] for r in rows) == list(range(n))
    assert all(r["key"] == f"k{r['n'] % 7}" and set(r) == {"n", "key"} for r in rows)
    # One transaction per task: each task's 25,000 rows are contiguous and in order.
    ns = [r["n"] for r in rows]
    for first in range(0, n, n // 4):
        i = ns.index(first)
        assert ns[i:i + n // 4] == list(range(first, first + n // 4))


def test_killed_task_leaves_no_partial_transaction(quire_spark: Any, stream_cluster: Any) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from quire.client import SyncClient

    journal = "sink/killed/part-000"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [journal])

    @F.udf(LongType())
    def die_at_750(n):  # type: ignore[no-untyped-def]  # (no hints: a plain UDF)
        if n == 750:
            os._exit(1)  # the task's Python worker dies mid-partition
        return n

    # Two tasks: rows 0..499 and 500..999; the second dies after buffering 250 rows.
    df = quire_spark.range(0, 1000, 1, 2).select(die_at_750("id").alias("n"))
    with pytest.raises(Exception):
        _write(df, stream_cluster, journal=journal).save()
    got = sorted(json.loads(line)["n"] for line in quire_read(stream_cluster, journal).splitlines())
    # The dead task wrote nothing; the other task's transaction is all or nothing.
    assert got in ([], list(range(500)))


def test_stream_into_a_journal(quire_spark: Any, stream_cluster: Any, tmp_path: Path) -> None:
    from quire.client import SyncClient

    src, dst = "sink/pipe/in-000", "sink/pipe/out-000"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [src, dst])
        append_messages(client, src, 0, 50)
        query = (quire_spark.readStream.format("quire")
                 .option("store", stream_cluster.store_url)
                 .option("brokers", ",".join(stream_cluster.endpoints))
                 .option("journals", src).load()
                 .selectExpr("value")
                 .writeStream.format("quire").option("brokers", ",".join(stream_cluster.endpoints))
                 .option("journal", dst).option("checkpointLocation", str(tmp_path / "ck"))
                 .start())
        try:
            query.processAllAvailable()
            append_messages(client, src, 50, 50)
            query.processAllAvailable()
        finally:
            query.stop()
        # Every message once; tasks (store spans, the tail) append in any order.
        assert sorted(client.read_all(dst).splitlines()) == sorted(client.read_all(src).splitlines())
        assert len(client.read_all(dst).splitlines()) == 100


@pytest.mark.parametrize("options, match", [
    ({"journal": "sink/no/such-journal"}, "unknown journal 'sink/no/such-journal'"),
    ({}, "option 'journal'"),
    ({"journal": "sink/write/part-000", "framing": "csv"}, "option 'framing'"),
    ({"journal": "sink/write/part-000", "bogus": "1"}, "option 'bogus'"),
])
def test_bad_sink_option_fails_at_save(quire_spark: Any, stream_cluster: Any,
                                       options: dict[str, str], match: str) -> None:
    df = quire_spark.range(3).selectExpr("id as n")
    with pytest.raises(Exception, match=match):
        _write(df, stream_cluster, **options).save()


def test_dask_to_quire_one_transaction_per_partition(stream_cluster: Any) -> None:
    import dask.dataframe as dd
    import pandas as pd

    from quire.client import SyncClient
    from spark.dask_writer import to_quire

    journals = ["sink/dask/part-000", "sink/dask/part-001"]
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, journals)
        pdf = pd.DataFrame({"n": range(300), "journal": [journals[i % 2] for i in range(300)]})
        appended = to_quire(dd.from_pandas(pdf, npartitions=3),
                            ",".join(stream_cluster.endpoints), scheduler="threads")
        # 3 partitions x 2 journals: one append each, every row once.
        assert len(appended) == 6 and sum(a[3] for a in appended) == 300
        for k, journal in enumerate(journals):
            rows = [json.loads(line) for line in client.read_all(journal).splitlines()]
            assert sorted(r["n"] for r in rows) == list(range(k, 300, 2))
            assert all(set(r) == {"n"} for r in rows)  # the journal column is not a field


_DIE_MID_APPEND = r"""
import os, sys, tempfile
import pyarrow as pa

class DyingSpool(tempfile.SpooledTemporaryFile):
    # The task's buffer: the process dies (as a killed executor would) once the append
    # has streamed two chunks of it to the coordinator, before the commit.
    reads = 0
    def read(self, *args):
        DyingSpool.reads += 1
        if DyingSpool.reads > 2:
            os._exit(9)
        return super().read(*args)

tempfile.SpooledTemporaryFile = DyingSpool
from spark.appender import parse_sink_options, write_task

opts = parse_sink_options({"brokers": sys.argv[1], "journal": sys.argv[2]}, ["n", "pad"])
batch = pa.RecordBatch.from_pylist([{"n": i, "pad": "x" * 100} for i in range(40_000)])
write_task(iter([batch]), opts)
print("appended")  # never: the process dies mid-append
"""


def test_process_killed_mid_append_leaves_nothing(stream_cluster: Any) -> None:
    """The sink's write path (spark.appender.write_task), killed while its one append per
    journal is streaming (~4.5 MB, past two 1 MiB chunks): the coordinator rolls the
    transaction back, nothing of it is visible, and the journal takes appends after."""
    from quire.client import SyncClient

    journal = "sink/killed/mid-append"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [journal])
        proc = subprocess.run([sys.executable, "-c", _DIE_MID_APPEND,
                               ",".join(stream_cluster.endpoints), journal],
                              capture_output=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 9, proc.stderr.decode()[-2000:]
        assert b"appended" not in proc.stdout
        assert client.append(journal, b'{"n":-1}\n').begin == 0  # nothing before it
        assert client.read_all(journal) == b'{"n":-1}\n'
