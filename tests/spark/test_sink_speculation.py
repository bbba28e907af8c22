"""Speculative execution on: a task's first attempt commits its append and then stalls;
Spark launches a speculative copy, which re-sends the same transaction — the journal
holds each row once.

Spark never runs a speculative copy on the host of the original attempt, and local
mode has one host, so this runs a real standalone cluster: a master and two workers on
two loopback addresses (127.0.0.2, 127.0.0.3), each with one core, and the driver
(tests/spark/eo_driver.py) as a subprocess. QUIRE_SINK_FAULT=hang-after-append makes
the first task to commit stall after its commit (spark/exactly_once.py).

Five JVMs (about 1-4 minutes on a shared 2-core box), so it runs with QUIRE_EO_FULL=1;
the short form in CI is test_sink_exactly_once.py's retried task, whose attempts share
the write id exactly as a speculative copy does."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.stream_helpers import make_journals
from tests.spark.test_sink_exactly_once import ROOT, counts, run_driver

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500),
              pytest.mark.skipif(not os.environ.get("QUIRE_EO_FULL"),
                                 reason="a standalone Spark cluster: set QUIRE_EO_FULL=1")]


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """spark://127.0.0.1:PORT with two one-core workers on two hosts."""
    from tools.services.process import Service, free_port

    port = free_port()
    env = {"PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_NO_DAEMONIZE": "1"}
    services = [Service("spark-master", [
        spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
        "--port", str(port), "--webui-port", str(free_port())],
        env=env, workdir=tmp_path / "master", probe=lambda: _listening("127.0.0.1", port),
        ready_timeout=120)]
    for i, host in enumerate(("127.0.0.2", "127.0.0.3")):
        services.append(Service(f"spark-worker-{i}", [
            spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", host,
            "--webui-port", "0", "--cores", "1", "--memory", "1g",
            "--work-dir", str(tmp_path / f"worker-{i}" / "work"), f"spark://127.0.0.1:{port}"],
            env={**env, "SPARK_LOCAL_IP": host, "QUIRE_SINK_FAULT":
                 f"hang-after-append:{tmp_path / 'faults'}"},
            workdir=tmp_path / f"worker-{i}"))
    try:
        services[0].start()
        for svc in services[1:]:
            svc.start(wait=False)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for svc in reversed(services):
            svc.kill()


def test_speculative_copy_lands_once(stream_cluster: Any, standalone: str,
                                     tmp_path: Path) -> None:
    from quire.client import SyncClient

    journal = "sink/eo/speculated-000"
    with SyncClient(stream_cluster.endpoints) as client:
        make_journals(client, stream_cluster.store_url, [journal], length=1 << 20)
    out = run_driver("eo-speculation-driver", [
        "batch", "--master", standalone, "--speculation",
        "--brokers", ",".join(stream_cluster.endpoints), "--write", f"{journal}:true",
        "--rows", "400", "--partitions", "4"], tmp_path / "driver", {}, timeout=900)
    assert "done" in out
    faults = tmp_path / "faults"
    hung = (faults / "hung").read_text()
    # Markers are <task>.attempt-<stage>.<partition>.<attempt number>: the stalled
    # attempt 0 and a speculative attempt 1 of that partition both appended.
    attempts = sorted(p.name.rpartition(".")[2] for p in faults.glob(f"{hung}.attempt-*"))
    assert attempts == ["0", "1"], attempts
    with SyncClient(stream_cluster.endpoints) as client:
        got = counts(client, journal)
    assert got == {n: 1 for n in range(400)}, "each row exactly once"
