"""Exactly-once out of Spark and Dask, against a real cluster (etcd, a coordinator, a
Celery worker persisting to a file store):

* a batch write in Spark local mode with task retries (`local[2,4]`) whose every task's
  process exits right after its append committed, before the task reports success
  (QUIRE_SINK_FAULT=exit-after-append): Spark retries each task and the journal holds
  each row once — and the same write with `exactly_once=false` holds each row twice,
  so the fault is real;
* a streaming query whose driver (a subprocess) is SIGKILLed after the sink committed
  micro-batch 1 and before Spark logged it (QUIRE_SINK_FAULT=hang-at-commit): restarted
  from the checkpoint, it re-runs batch 1 and every row lands once;
* Dask `to_quire` on a distributed LocalCluster whose worker process exits right after
  each task's append committed: the scheduler runs the task again on a live worker, once.

The Spark drivers are subprocesses (tests/spark/eo_driver.py) because they need their
own master and fault environment; the speculation case is in
test_sink_speculation.py (it needs executors on two hosts)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.spark.stream_helpers import make_journals, message, wait_for

# Spark drivers of their own and killed processes: minutes on a loaded 2-core box.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]


def run_driver(name: str, args: list[str], workdir: Path, env: dict[str, str],
               timeout: float = 600) -> str:
    """Run tests/spark/eo_driver.py to completion (its process group killed whatever
    happens); returns its output."""
    from tools.services.process import Service

    svc = Service(name, [sys.executable, "-m", "tests.spark.eo_driver", *args],
                  env={"PYTHONPATH": str(ROOT), **env}, workdir=workdir)
    svc.start(wait=False)
    try:
        deadline = time.monotonic() + timeout
        while svc.returncode is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert svc.returncode == 0, f"{name} exited {svc.returncode}:\n{svc.log_tail(60)}"
        return svc.log_text()
    finally:
        svc.kill()


def counts(client: Any, journal: str) -> Counter[int]:
    return Counter(json.loads(line)["n"] for line in client.read_all(journal).splitlines())


@pytest.fixture(scope="module")
def killed_tasks(stream_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One driver run: the same 400-row, 4-task write into one journal exactly-once and
    into another with plain appends; every task's first attempt exits after its commit."""
    from quire.client import SyncClient

    work = tmp_path_factory.mktemp("eo-batch")
    eo, plain = "sink/eo/retried-000", "sink/eo/plain-000"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [eo, plain], length=1 << 20)
    faults = work / "faults"
    out = run_driver("eo-batch-driver", [
        "batch", "--master", "local[2,4]", "--brokers", ",".join(stream_cluster.endpoints),
        "--write", f"{eo}:true", "--write", f"{plain}:false", "--rows", "400",
        "--partitions", "4"], work, {"QUIRE_SINK_FAULT": f"exit-after-append:{faults}"})
    assert "done" in out
    with SyncClient(stream_cluster.endpoints) as client:
        return counts(client, eo), counts(client, plain), faults


def test_retried_task_lands_once(killed_tasks: Any) -> None:
    eo, _, faults = killed_tasks
    # 8 tasks (4 per write) each died once after its commit, then ran again.
    assert len(list(faults.glob("*.first"))) == 8
    for first in faults.glob("*.first"):
        attempts = list(faults.glob(first.stem + ".attempt-*"))
        assert len(attempts) >= 2, f"task {first.stem} was not retried: {attempts}"
    assert eo == Counter(range(400)), "each row exactly once"


def test_plain_appends_duplicate_under_the_same_fault(killed_tasks: Any) -> None:
    _, plain, _ = killed_tasks
    # The same fault with exactly_once=false: the retries appended every task's rows again.
    assert set(plain) == set(range(400))
    assert set(plain.values()) == {2}


def test_restarted_query_lands_its_batch_once(stream_cluster: Any, tmp_path: Path) -> None:
    from quire.client import SyncClient
    from tools.services.process import Service

    src, dst = "sink/eo/stream-in-000", "sink/eo/stream-out-000"
    brokers = ",".join(stream_cluster.endpoints)
    checkpoint, faults = tmp_path / "ck", tmp_path / "faults"
    args = ["stream", "--master", "local[2]", "--brokers", brokers,
            "--store", stream_cluster.store_url, "--src", src, "--dst", dst,
            "--checkpoint", str(checkpoint)]
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [src, dst])
        client.append(src, b"".join(message(src, n) for n in range(50)))
        driver = Service("eo-stream-driver", [sys.executable, "-m", "tests.spark.eo_driver",
                                              *args],
                         env={"PYTHONPATH": str(ROOT),
                              "QUIRE_SINK_FAULT": f"hang-at-commit:{faults}:1"},
                         workdir=tmp_path / "run-1")
        driver.start(wait=False)
        try:
            # Batch 0 (50 messages) runs and is logged; then batch 1 (50 more, one append).
            wait_for(lambda: (checkpoint / "commits" / "0").exists(), 600, "batch 0 logged")
            client.append(src, b"".join(message(src, n) for n in range(50, 100)))
            wait_for(lambda: (faults / "batch-1.committed").exists() or not driver.running,
                     600, "the sink's commit of batch 1")
            assert driver.running, driver.log_tail(60)
            # The sink's tasks committed batch 1; Spark has not logged it: kill the driver.
            driver.kill()
        finally:
            driver.kill()
        assert (checkpoint / "offsets" / "1").exists()
        assert not (checkpoint / "commits" / "1").exists()
        before = Counter(client.read_all(dst).splitlines())
        assert len(before) == 100 and set(before.values()) == {1}  # batch 1 had landed

        out = run_driver("eo-stream-restart", [*args, "--until-idle"], tmp_path / "run-2", {})
        assert "done" in out
        assert (checkpoint / "commits" / "1").exists()  # the restart re-ran batch 1
        after = Counter(client.read_all(dst).splitlines())
        assert after == Counter(client.read_all(src).splitlines())
        assert set(after.values()) == {1}, "every row of batch 1 exactly once"


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two worker processes (with nannies, which restart a worker that exits), whose
    environment arms the fault hook: a task's first attempt exits its worker."""
    from distributed import Client, LocalCluster

    faults = tmp_path_factory.mktemp("dask-faults")
    # The nannies live in this process and start (and restart) the worker processes
    # with this environment.
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address=None,
                           worker_dashboard_address=None,
                           env={"QUIRE_SINK_FAULT": f"exit-after-append:{faults}",
                                "PYTHONPATH": str(ROOT)})
    try:
        with Client(cluster) as client:
            yield client, faults
    finally:
        cluster.close()


@pytest.mark.parametrize("exactly_once", [True, False])
def test_dask_worker_killed_after_append(stream_cluster: Any, dask_cluster: Any,
                                         exactly_once: bool) -> None:
    import dask.dataframe as dd
    import pandas as pd

    from quire.client import SyncClient
    from spark.dask_writer import to_quire

    client, faults = dask_cluster
    journal = f"sink/eo/dask-{'once' if exactly_once else 'plain'}-000"
    with SyncClient(stream_cluster.endpoints) as quire:
        make_journals(quire, stream_cluster.store_url, [journal])
        ddf = dd.from_pandas(pd.DataFrame({"n": range(200)}), npartitions=2)
        before = len(list(faults.glob("*.first")))
        to_quire(ddf, ",".join(stream_cluster.endpoints), journal=journal,
                 exactly_once=exactly_once, scheduler=client)
        assert len(list(faults.glob("*.first"))) == before + 2  # both workers died once
        got = counts(quire, journal)
    assert set(got) == set(range(200))
    # Each task ran again after its worker died: with ids every row lands once; without,
    # every row at least twice — as often as Dask ran its task (a third run when the
    # scheduler also gave up on a slow worker under load: {2, 3} once in CI).
    if exactly_once:
        assert set(got.values()) == {1}
    else:
        assert min(got.values()) >= 2, got
