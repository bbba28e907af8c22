"""A streaming query on a Spark standalone cluster, every process on its own simulated
host (tools.hosts), reading journals that coordinators on other hosts serve:

    h0  etcd (one member)          h1, h2  coordinators (zones a, b; listen on and
                                           advertise the host's address)
    h3  moto S3 (the store), Redis, the Celery worker that persists fragments
    h4  Spark master               h5, h6  Spark workers
    the observer (root namespace): the writers, and the Spark driver — the continuous
    job `python -m spark.jobs.minute_counts --master spark://h4 --conf
    spark.driver.host=<observer> -O s3.endpoint=http://h3:... --brokers h1:8080,h2:8080`

Source journals (replication 2: a replica on each coordinator host) get a first wave
of events, which the Celery worker persists to S3 before the query starts; the query
reads that history from the store and the rest from the coordinators, micro-batch by
micro-batch (maxBytesPerTrigger), and its exactly-once sink appends per-minute counts
to an output journal through the coordinators. A second wave appended while it runs is
picked up by later micro-batches. The summed counts equal the model's exactly (nothing
lost, nothing twice), executors ran on both worker hosts, and no broker advertises a
loopback address.

Spark gives a Python process it starts on the driver (the streaming source's runner)
a fixed 10 s to connect back; at load 20+ on the shared VM, while the executors' JVMs
start, that can fail the query at its start. The driver runs with `--restarts 3`: it
starts a failed query again from its checkpoint, in the same application (executors
up); the exactly-once sink means the counts may not change. Restarts are printed.

Long (a master, two workers and a driver: four JVMs, besides etcd, two coordinators,
S3, Redis and Celery): runs when QUIRE_TEST_LONG=1.

    QUIRE_TEST_LONG=1 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        tests/spark/test_stream_on_hosts.py
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tools.hosts import HostHarness, available

_REASON = available()
pytestmark = [
    pytest.mark.spark,
    pytest.mark.long,
    pytest.mark.skipif(_REASON is not None, reason=f"simulated hosts: {_REASON}"),
    pytest.mark.skipif(not os.environ.get("QUIRE_TEST_LONG"),
                       reason="long test (a Spark standalone cluster and a quire cluster on "
                              "hosts): QUIRE_TEST_LONG=1"),
    pytest.mark.timeout(1800),
]

ROOT = "/quire-stream-hosts"
BUCKET = "stream-hosts"
STORE = f"s3://{BUCKET}/quire/"
TOPIC = "host-clicks"
SOURCES = [f"hosts/clicks/part-{i:03d}" for i in range(3)]
OUT = "hosts/minute-counts"
Counts = collections.Counter[tuple[str, str]]


@dataclass
class QuireOnHosts:
    harness: HostHarness
    s3: Any
    coordinators: list[Any]

    @property
    def endpoints(self) -> list[str]:
        return [c.endpoint for c in self.coordinators]

    def source_options(self) -> dict[str, str]:
        """Store options of the `quire` source: the S3 endpoint on h3, as the driver and
        the executors (on other hosts) reach it."""
        return {"s3.endpoint": self.s3.url, "s3.accessKey": self.s3.access_key,
                "s3.secretKey": self.s3.secret_key}

    def persisted_end(self, journal: str) -> int:
        from fragment_store import CoverSet, list_fragments, open_store

        store = open_store(STORE, endpoint=self.s3.url, access_key=self.s3.access_key,
                           secret_key=self.s3.secret_key)
        end = 0
        for f in CoverSet(list_fragments(store, journal)):
            if f.begin > end:
                break
            end = max(end, f.end)
        return end


@pytest.fixture(scope="module")
def quire_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuireOnHosts]:
    from chaos.host_cluster import HostCoordinator
    from tools.services import CeleryWorkerService, RedisService, S3Service

    zones = ["etcd", "zone-a", "zone-b", "store", "spark", "spark", "spark"]
    with HostHarness(7, zones=zones, workdir=tmp_path_factory.mktemp("stream-hosts")) as h:
        etcd = h.etcd_cluster([h.hosts[0]]).start()
        st = h.hosts[3]
        s3 = st.adopt(S3Service("s3", listen_host=st.address, workdir=st.workdir / "s3"))
        redis = st.adopt(RedisService("redis", listen_host=st.address,
                                      workdir=st.workdir / "redis"))
        s3.start()
        redis.start()
        s3.create_bucket(BUCKET)
        env = {**s3.client_env(), **redis.client_env(), **etcd.client_env(),
               "QUIRE_ETCD_ROOT": ROOT}
        coordinators = [HostCoordinator(
            f"coord-{host.name}", host=host, zone=host.zone, suffix=f"coord{host.name}",
            etcd_url=etcd.url, root=ROOT, redis_url=redis.url, env=env,
            workdir=host.workdir / "coordinator") for host in h.hosts[1:3]]
        for c in coordinators:
            c.start(wait=False)
        for c in coordinators:
            c.wait_ready()
        st.adopt(CeleryWorkerService("worker", redis_url=redis.url,
                                     queues=("persist", "index", "pulse"), env=env,
                                     workdir=st.workdir / "worker")).start()
        yield QuireOnHosts(h, s3, coordinators)
        # The harness stops every service of every host on close.


def _events(first: int, count: int, minutes: range, keys: int) -> list[dict[str, str]]:
    out = []
    for i in range(first, first + count):
        minute = minutes[i % len(minutes)]
        out.append({"key": f"user-{i % keys}", "ts": f"2026-01-01T00:{minute:02d}:{i % 60:02d}Z"})
    return out


def _append(client: Any, events: list[dict[str, str]], want: Counts) -> None:
    """Round-robin over the source journals, a few events per append."""
    for start in range(0, len(events), 4):
        chunk = events[start:start + 4]
        journal = SOURCES[(start // 4) % len(SOURCES)]
        client.append(journal, b"".join(json.dumps(e).encode() + b"\n" for e in chunk))
        for e in chunk:
            want[(e["ts"][:17] + "00Z", e["key"])] += 1


def _sources_with_a_first_wave(client: Any, quire_hosts: QuireOnHosts, want: Counts) -> None:
    """Check that every broker advertises its host's address (none loopback), apply the
    source journals (R=2, 2 KiB fragments into S3) and append a first wave of events."""
    from protocol import Codec, FragmentSpec, JournalSpec, LabelSet

    h = quire_hosts.harness.hosts
    advertised = {b.endpoint.rpartition(":")[0] for b in client.list_brokers()}
    assert advertised == {h[1].address, h[2].address}
    assert not any(ipaddress.ip_address(a).is_loopback for a in advertised)
    client.apply([JournalSpec(
        name=j, replication=2, labels=LabelSet.of(topic=TOPIC),
        fragment=FragmentSpec(length=2048, compression_codec=Codec.GZIP, stores=(STORE,),
                              refresh_interval=1.0)) for j in SOURCES])
    client.wait_writable(SOURCES, timeout=60)
    _append(client, _events(0, 300, range(0, 7), 3), want)


def _output(client: Any) -> tuple[Counts, set[int]]:
    """The output journal's counts summed per (minute, key), and its batch ids."""
    got: Counts = collections.Counter()
    batches = set()
    for line in client.read_all(OUT).splitlines():
        row = json.loads(line)
        got[(row["minute"], row["key"])] += row["events"]
        batches.add(row["batch"])
    return got, batches


def _until_counted(client: Any, driver: Any, total: int, timeout: float) -> tuple[Counts, set[int]]:
    """Poll the output journal until its counts sum to `total` (the driver must keep
    running meanwhile)."""
    deadline = time.monotonic() + timeout
    got: Counts = collections.Counter()
    while True:
        if not driver.running:
            raise AssertionError(f"the driver exited ({driver.returncode}):\n"
                                 f"{driver.log_tail(60)}")
        if OUT in {e.spec.name for e in client.list_journals("")}:
            got, batches = _output(client)
            if sum(got.values()) >= total:
                return got, batches
        if time.monotonic() > deadline:
            raise AssertionError(f"{sum(got.values())} of {total} events counted after "
                                 f"{timeout:g} s:\n{driver.log_tail(60)}")
        time.sleep(1.0)


def test_minute_counts_stream_on_a_standalone_cluster_across_hosts(
        quire_hosts: QuireOnHosts, tmp_path: Path) -> None:
    from quire.client import SyncClient
    from tests.spark.stream_helpers import wait_for
    from tools.services import Service
    from tools.services.spark_cluster import SparkCluster

    h = quire_hosts.harness.hosts
    want: Counts = collections.Counter()
    with SyncClient(quire_hosts.endpoints) as client:
        _sources_with_a_first_wave(client, quire_hosts, want)
        first_total = sum(want.values())
        # History in S3 on h3 before the query starts: the first micro-batches read it
        # from the store (fragments the Celery worker fetched from the coordinators).
        wait_for(lambda: all(quire_hosts.persisted_end(j) > 0 for j in SOURCES),
                 timeout=120, what="fragments of every source journal in S3")

        with SparkCluster(2, hosts=[h[4], h[5], h[6]], workdir=h[4].workdir / "spark") as spark:
            conf = spark.driver_conf(quire_hosts.harness.observer_address)
            argv = [sys.executable, "-m", "spark.jobs.minute_counts",
                    "--master", spark.master_url, "--brokers", ",".join(quire_hosts.endpoints),
                    "--selector", f"topic={TOPIC}", "--out-journal", OUT,
                    "--checkpoint", str(tmp_path / "checkpoint"),
                    "--max-bytes-per-trigger", "8192", "--restarts", "3",
                    *(a for k, v in quire_hosts.source_options().items() for a in ("-O", f"{k}={v}")),
                    *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}"))]
            driver = Service("stream-driver", argv, workdir=tmp_path / "driver")
            driver.start()
            try:
                got, first_batches = _until_counted(client, driver, first_total, 600)
                assert got == want  # the first wave, exactly
                assert len(first_batches) > 1  # maxBytesPerTrigger: several micro-batches

                # More events while the query runs (new minutes and keys): later batches.
                _append(client, _events(300, 150, range(10, 13), 5), want)
                got, batches = _until_counted(client, driver, sum(want.values()), 300)
                assert got == want
                assert min(batches - first_batches) > max(first_batches)
                assert spark.executor_hosts() == {h[5].address, h[6].address}
            finally:
                driver.stop(timeout=30)
        # Stopped: still exactly the model (no micro-batch landed twice).
        assert _output(client)[0] == want
    restarts = [line for line in driver.log_path.read_text().splitlines()
                if line.startswith("minute-counts: query failed")]
    print(f"query restarts from the checkpoint: {restarts or 'none'}")
