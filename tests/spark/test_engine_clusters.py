"""Spark and Dask as clusters, each process on its own simulated host (tools.hosts):

    h0  moto S3 (the store)         h1  Spark master     h2, h3  Spark workers
    h4  Dask scheduler              h5, h6  Dask workers
    the observer (root namespace): the Spark driver (`quire spark run`) and the Dask client

`quire spark run hourly-counts --master spark://h1` gives exactly the rows local mode
gives, with executors on both worker hosts; the Dask reader computed on the distributed
scheduler gives exactly the rows of Dask's local scheduler and of the store's content,
with tasks on both worker hosts.

A streaming query on the standalone cluster, against coordinators on other hosts, is
tests/spark/test_stream_on_hosts.py; on the Dask cluster, tests/spark/test_dask_stream_on_hosts.py.

The Spark test is long (a master, two workers and a driver: four JVMs; 7 min on the
shared 2-core VM at load 15-22) and runs when QUIRE_TEST_LONG=1; the Dask test (~1 min
at load 33) runs in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.batch_corpus import Corpus, StoreUnderTest, build_corpus
from tests.spark.test_batch_dask import expected
from tools.hosts import HostHarness, available
from tools.services import S3Service
from tools.services.dask_cluster import DaskCluster
from tools.services.spark_cluster import SparkCluster

_REASON = available()
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=f"simulated hosts: {_REASON}"),
    pytest.mark.timeout(1800),
]


SELECTOR = "prefix=topics/"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostHarness]:
    with HostHarness(7, workdir=tmp_path_factory.mktemp("engine-hosts")) as h:
        yield h


@pytest.fixture(scope="module")
def store(hosts: HostHarness) -> Iterator[StoreUnderTest]:
    h0 = hosts.hosts[0]
    s3 = h0.adopt(S3Service("s3-h0", listen_host=h0.address, workdir=h0.workdir / "s3"))
    with s3:
        s3.create_bucket("engines")
        yield StoreUnderTest(url="s3://engines/quire/", kind="s3", options={
            "s3.endpoint": s3.url, "s3.accessKey": s3.access_key, "s3.secretKey": s3.secret_key})


@pytest.fixture(scope="module")
def corpus(store: StoreUnderTest) -> Corpus:
    return build_corpus(store)


def _rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = pq.read_table(str(out)).to_pylist()
    return sorted(rows, key=lambda r: (r["key"], r["hour"]))


@pytest.mark.spark
@pytest.mark.long
@pytest.mark.skipif(not os.environ.get("QUIRE_TEST_LONG"),
                    reason="long test (a Spark standalone cluster on hosts): QUIRE_TEST_LONG=1")
def test_hourly_counts_on_a_standalone_cluster_equal_local_mode(
        hosts: HostHarness, store: StoreUnderTest, corpus: Corpus, quire_spark: Any,
        tmp_path: Path) -> None:
    from spark.jobs import get_job
    from spark.jobs.common import JobParams

    options = [f"{k}={v}" for k, v in store.options.items()]
    local_out = tmp_path / "local"
    get_job("hourly-counts").run(quire_spark, JobParams(
        store=store.url, out=str(local_out), selector=SELECTOR, options=dict(store.options)))
    local = _rows(local_out)
    assert local, "the corpus gives rows"

    h = hosts.hosts
    with SparkCluster(2, hosts=[h[1], h[2], h[3]], workdir=h[1].workdir / "spark") as spark:
        out = tmp_path / "cluster"
        conf = spark.driver_conf(hosts.observer_address)
        argv = [str(Path(sys.executable).parent / "quire"), "spark", "run", "hourly-counts",
                "--master", spark.master_url, "--store", store.url, "--selector", SELECTOR,
                "--out", str(out), *(a for o in options for a in ("-O", o)),
                *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}"))]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"wrote {len(local)} rows" in done.stdout
        # Both workers ran an executor: the job was spread over two hosts.
        assert spark.executor_hosts() == {h[2].address, h[3].address}
    assert _rows(out) == local


def test_dask_reader_on_a_distributed_cluster_equals_local(
        hosts: HostHarness, store: StoreUnderTest, corpus: Corpus) -> None:
    import distributed

    from spark.dask_reader import read_journals

    def frame() -> Any:
        return read_journals(store.url, selector=SELECTOR, **store.dask_options())

    def messages(df: Any) -> dict[str, list[tuple[int, bytes]]]:
        out: dict[str, list[tuple[int, bytes]]] = {}
        for journal, offset, value in sorted(zip(df.journal, df.offset, df.value)):
            out.setdefault(journal, []).append((int(offset), value.encode()))
        return out

    local = frame().compute(scheduler="threads")
    h = hosts.hosts
    with DaskCluster(2, hosts=[h[4], h[5], h[6]], workdir=h[4].workdir / "dask") as dask:
        with distributed.Client(dask.scheduler_address, timeout=60,
                                set_as_default=False) as client:
            with distributed.get_task_stream(client=client) as tasks:
                remote = client.compute(frame()).result(timeout=300)
            ran_on = {str(t["worker"]).removeprefix("tcp://").rpartition(":")[0]
                      for t in tasks.data}
    assert messages(remote) == messages(local) == expected(corpus, 0, None)
    assert ran_on == {h[5].address, h[6].address}
