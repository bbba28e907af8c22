"""Spark local mode (the session-wide SparkSession): the `quire` data source reads the
same messages, offsets and bytes as the Dask reader and the store's own content, on
both stores, across journals, codecs, uneven fragments and messages spanning them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.batch_corpus import (
    Corpus,
    StoreUnderTest,
    build_corpus,
    expected_messages,
    json_lines,
    persist_journal,
)
from tests.spark.test_batch_dask import dask_messages, expected

pytestmark = pytest.mark.spark


def spark_messages(spark: Any, sut: StoreUnderTest, **options: Any
                   ) -> dict[str, list[tuple[int, bytes]]]:
    df = (spark.read.format("quire").option("store", sut.url).options(**sut.options)
          .options(**{k: str(v) for k, v in options.items()}).load())
    table = df.select("journal", "offset", "value").toArrow()
    out: dict[str, list[tuple[int, bytes]]] = {}
    rows = sorted(zip(*(table.column(c).to_pylist() for c in ("journal", "offset", "value"))))
    for journal, offset, value in rows:
        out.setdefault(journal, []).append((offset, value.encode()))
    return out


def test_spark_dask_and_store_agree(quire_spark: Any, any_store: StoreUnderTest) -> None:
    corpus = build_corpus(any_store)
    # Split spans are exercised finely by the Dask and framing tests; here a few.
    ranges = [dict(), dict(begin=1234, end=40000, maxSpanBytes=20000, splitCompressed="true")]
    for r in ranges:
        want = expected(corpus, r.get("begin", 0), r.get("end"))
        via_spark = spark_messages(quire_spark, any_store, selector="prefix=topics/", **r)
        via_dask = dask_messages(any_store, selector="prefix=topics/", **r)
        assert via_spark == want, r
        assert via_dask == want, r
    # One input partition per fragment (read-past does not add partitions).
    df = (quire_spark.read.format("quire").option("store", any_store.url)
          .options(**any_store.options).option("selector", "prefix=topics/").load())
    assert df.rdd.getNumPartitions() == sum(len(f) for f in corpus.fragments.values())


def test_raw_framing_bytes_are_the_journal(quire_spark: Any, file_store: StoreUnderTest) -> None:
    corpus = build_corpus(file_store, sizes={"topics/views/part-000": 200})
    content = corpus.contents["topics/views/part-000"]
    df = (quire_spark.read.format("quire").option("store", file_store.url)
          .option("journal", "topics/views/part-000").option("framing", "raw")
          .option("begin", "7").option("end", str(len(content) - 3)).load())
    rows = sorted((r.offset, bytes(r.value)) for r in df.select("offset", "value").collect())
    assert b"".join(v for _, v in rows) == content[7:-3]


def test_json_schema_columns(quire_spark: Any, file_store: StoreUnderTest) -> None:
    corpus = build_corpus(file_store, sizes={"topics/clicks/part-000": 400})
    content = corpus.contents["topics/clicks/part-000"]
    df = (quire_spark.read.format("quire").option("store", file_store.url)
          .option("journal", "topics/clicks/part-000")
          .schema("offset bigint, key string, n bigint, ts timestamp").load())
    rows = sorted(df.collect())
    msgs = [json.loads(v) for _, v in expected_messages(content)]
    assert [(r.key, r.n) for r in rows] == [(m["key"], m["n"]) for m in msgs]
    assert rows[0].ts.year == 2026


def test_index_mode(quire_spark: Any, file_store: StoreUnderTest) -> None:
    corpus = build_corpus(file_store, sizes={"topics/a-part": 60, "topics/b-part": 60})
    df = (quire_spark.read.format("quire").option("store", file_store.url)
          .option("selector", "prefix=topics/").option("mode", "index").load())
    got = sorted((r.journal, r.begin, r.end, r.codec, r.key) for r in df.collect())
    from fragment_store import fragment_key

    assert got == sorted((f.journal, f.begin, f.end, f.codec.value, fragment_key(f))
                         for frags in corpus.fragments.values() for f in frags)


def test_gzip_fragments_are_plain_files_spark_json_reads(quire_spark: Any,
                                                          file_store: StoreUnderTest) -> None:
    import random

    content = json_lines(random.Random(5), 500)
    cuts = [content.index(b"\n", i) + 1 for i in range(3000, len(content) - 100, 7000)]
    persist_journal(file_store.store(), "plain/gzip-journal", content, cuts, ("gzip",))
    root = file_store.url[len("file://"):]
    df = quire_spark.read.json(f"{root}plain/gzip-journal/*.gz")
    assert sorted(r.n for r in df.select("n").collect()) == list(range(500))


def test_bad_option_message_names_it(quire_spark: Any, file_store: StoreUnderTest) -> None:
    with pytest.raises(Exception, match="option 'begin'"):
        (quire_spark.read.format("quire").option("store", file_store.url)
         .option("journal", "topics/x").option("begin", "yesterday").load())


def test_hourly_counts_job(quire_spark: Any, file_store: StoreUnderTest, tmp_path: Path) -> None:
    from spark.jobs import get_job
    from spark.jobs.common import JobParams

    corpus: Corpus = build_corpus(file_store)
    out = tmp_path / "report"
    job = get_job("hourly-counts")
    written = job.run(quire_spark, JobParams(store=file_store.url, out=str(out),
                                             selector="prefix=topics/clicks/"))
    got = {(r.key, r.hour.hour): (r.messages, r.bytes) for r in written.collect()}
    want: dict[tuple[str, int], list[int]] = {}
    for j, content in corpus.contents.items():
        if j.startswith("topics/clicks/"):
            for _, value in expected_messages(content):
                m = json.loads(value)
                acc = want.setdefault((m["key"], int(m["ts"][11:13])), [0, 0])
                acc[0] += 1
                acc[1] += len(value) + 1
    assert got == {k: tuple(v) for k, v in want.items()}
    assert list(out.glob("date=2026-01-01/*.parquet"))


@pytest.mark.skipif(not os.environ.get("QUIRE_TEST_SPARK_SUBMIT"),
                    reason="starts a second JVM (~30-60 s); set QUIRE_TEST_SPARK_SUBMIT=1")
def test_spark_submit_runs_the_job(file_store: StoreUnderTest, tmp_path: Path) -> None:
    """The same job through spark-submit, as docs/batch.md documents it."""
    build_corpus(file_store, sizes={"topics/clicks/part-000": 120})
    repo = Path(__file__).resolve().parents[2]
    bindir = Path(sys.executable).parent
    zip_path = tmp_path / "quire-batch.zip"
    subprocess.run([sys.executable, "-m", "spark.main", "package", "--out", str(zip_path)],
                   cwd=repo, check=True, capture_output=True)
    out = tmp_path / "report"
    proc = subprocess.run(
        [str(bindir / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         "--conf", f"spark.pyspark.python={sys.executable}",
         "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--py-files", str(zip_path), str(repo / "spark/jobs/hourly_counts.py"),
         "--store", file_store.url, "--selector", "prefix=topics/clicks/", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hourly-counts: wrote" in proc.stdout
    assert list(out.glob("date=*/*.parquet"))
