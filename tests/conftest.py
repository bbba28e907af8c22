"""Session-wide real services and per-test slices of them.

etcd, redis-server and the S3 server start once per session (seconds each);
every test gets its own etcd prefix, Redis database and bucket, checked empty
on the way in and wiped on the way out. Helpers live in tools.services.
"""

from __future__ import annotations

import os
import sys

from collections.abc import Iterator

import pytest

# A test never finds a cluster a developer left running in the default data dir
# (protocol/discovery.py); tests of discovery give their subprocesses an env without this.
os.environ.setdefault("QUIRE_DISCOVER", "0")

from tools.services import (
    Bucket,
    EtcdService,
    RedisDb,
    RedisDbPool,
    RedisService,
    S3Service,
    etcd_prefix,
    fresh_bucket,
    kill_all,
)


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdService]:
    with EtcdService("etcd-session") as svc:
        yield svc


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisService]:
    with RedisService("redis-session", databases=32) as svc:
        yield svc


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Service]:
    with S3Service("s3-session") as svc:
        yield svc


@pytest.fixture(scope="session")
def _redis_pool(redis_server: RedisService) -> RedisDbPool:
    return RedisDbPool(redis_server)


@pytest.fixture
def etcd_root(etcd: EtcdService, request: pytest.FixtureRequest) -> Iterator[str]:
    with etcd_prefix(etcd, request.node.name) as root:
        yield root


@pytest.fixture
def redis_db(_redis_pool: RedisDbPool, request: pytest.FixtureRequest) -> Iterator[RedisDb]:
    with _redis_pool.lease(request.node.name) as db:
        yield db


@pytest.fixture
def s3_bucket(s3: S3Service, request: pytest.FixtureRequest) -> Iterator[Bucket]:
    with fresh_bucket(s3, request.node.name) as bucket:
        yield bucket


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    # One JVM for the whole session: a cold SparkSession takes 15-20 s.
    from pyspark.sql import SparkSession

    # Spark's Python workers are started by the JVM: make them this interpreter, so they
    # import the same packages (msgspec, fragment_store, spark) the tests do. The JVM
    # gateway resolves its own address before any conf is read (Utils.localHostName):
    # SPARK_LOCAL_IP keeps that on loopback too, as every test address must be.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .appName("quire-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Session fixtures are torn down by now, so anything tools.services still
    # tracks is a leak: fail the run rather than leave processes behind. Under
    # pytest-xdist a worker hands its list to the controller, which reports it.
    leftovers = [f"{s.name} (pid {s.pid})" for s in kill_all()]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["quire_leftovers"] = leftovers
        return
    leftovers += _worker_leftovers
    if leftovers:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n")
            reporter.write_line(f"ERROR: processes left running, now killed: {', '.join(leftovers)}",
                                red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_worker_leftovers: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:  # pytest-xdist's hook
    _worker_leftovers.extend(getattr(node, "workeroutput", {}).get("quire_leftovers", []))
