"""Fixtures for the batch (spark/) tests; helpers that build journals are in
tests/spark/batch_corpus.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.batch_corpus import StoreUnderTest

# Spark's Python workers are started by the JVM: make them this interpreter, able to
# import the repository's packages (set before the session-wide SparkSession starts).
_ROOT = str(Path(__file__).resolve().parents[2])
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture
def file_store(tmp_path: Path) -> StoreUnderTest:
    return StoreUnderTest(url=f"file://{tmp_path}/store/", options={}, kind="file")


@pytest.fixture(params=["file", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreUnderTest]:
    if request.param == "file":
        yield StoreUnderTest(url=f"file://{tmp_path}/store/", options={}, kind="file")
        return
    bucket = request.getfixturevalue("s3_bucket")
    s3 = request.getfixturevalue("s3")
    yield StoreUnderTest(
        url=f"s3://{bucket.name}/quire/",
        options={"s3.endpoint": bucket.url, "s3.accessKey": s3.access_key,
                 "s3.secretKey": s3.secret_key},
        kind="s3")


@pytest.fixture(scope="session")
def quire_spark(spark: Any) -> Any:
    """The session's SparkSession with the `quire` format registered."""
    from spark.datasource import register

    register(spark)
    return spark


@pytest.fixture(scope="session")
def stream_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real cluster for the streaming source and sink tests: etcd, a coordinator,
    Redis and a Celery worker persisting to a file store. Tests use their own journals
    (tests/spark/stream_helpers.py)."""
    from chaos.cluster import LocalCluster

    work = tmp_path_factory.mktemp("stream-cluster")
    with LocalCluster(n=1, worker=True, workdir=work / "cluster") as cluster:
        cluster.store_url = f"file://{work}/store/"  # type: ignore[attr-defined]
        yield cluster
