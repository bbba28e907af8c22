"""The Dask streaming query across hosts: a Dask distributed scheduler and two workers,
each on its own simulated host (tools.hosts), run minute-counts (spark.dask_stream,
spark/jobs/dask_minute_counts.py) over journals that coordinators on other hosts serve —
the same quire cluster as tests/spark/test_stream_on_hosts.py (its `quire_hosts`):

    h0  etcd                        h1, h2  coordinators (zones a, b)
    h3  moto S3, Redis, the Celery worker persisting fragments
    h4  Dask scheduler              h5, h6  Dask workers
    the observer (root namespace): the writers and the query's driver

A first wave of events is persisted to S3 before the query starts (read from the store
by the workers), the query counts it in several micro-batches (maxBytesPerTrigger); a
second wave is appended and one micro-batch of it runs; then the driver's state is made
the state a driver killed between a batch's append and its commit leaves (the batch's
commit removed from the checkpoint; tests/spark/test_dask_stream.py kills a real driver
there), a third wave is appended, and a new driver on the checkpoint re-runs that batch
and counts the rest. The
summed counts equal the model exactly, the read tasks ran on both worker hosts, and
every broker advertises its host's address.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

from tests.spark.test_stream_on_hosts import (  # noqa: F401 (quire_hosts is a fixture)
    OUT, SOURCES, STORE, TOPIC, Counts, QuireOnHosts, _append, _events, _output, quire_hosts,
    _sources_with_a_first_wave)
from tools.hosts import available

_REASON = available()
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=f"simulated hosts: {_REASON}"),
    pytest.mark.timeout(1200),
]


def test_dask_stream_on_a_distributed_cluster_across_hosts(
        quire_hosts: QuireOnHosts, tmp_path: Path) -> None:
    import distributed

    from quire.client import SyncClient
    from spark.dask_stream import DaskStreamQuery
    from spark.jobs.dask_minute_counts import SCHEMA, count_minutes
    from spark.jobs.minute_counts import StreamParams, prepare
    from tests.spark.stream_helpers import wait_for
    from tools.services.dask_cluster import DaskCluster

    h = quire_hosts.harness.hosts
    brokers = ",".join(quire_hosts.endpoints)
    checkpoint = tmp_path / "checkpoint"
    want: Counts = collections.Counter()
    with SyncClient(quire_hosts.endpoints) as client:
        _sources_with_a_first_wave(client, quire_hosts, want)
        wait_for(lambda: all(quire_hosts.persisted_end(j) > 0 for j in SOURCES),
                 timeout=120, what="fragments of every source journal in S3")
        prepare(StreamParams(brokers=brokers, out_journal=OUT, checkpoint=str(checkpoint),
                             store=STORE, selector=f"topic={TOPIC}"))

        with DaskCluster(2, hosts=[h[4], h[5], h[6]], workdir=h[4].workdir / "dask") as dask, \
                distributed.Client(dask.scheduler_address, timeout=60,
                                   set_as_default=False) as dc:
            def query() -> DaskStreamQuery:  # a driver (a new one after the "kill")
                return DaskStreamQuery(dc, count_minutes, checkpoint=str(checkpoint),
                                       brokers=brokers, out_journal=OUT, schema=SCHEMA,
                                       store=STORE, selector=f"topic={TOPIC}",
                                       maxBytesPerTrigger=8192, trigger_seconds=0.2,
                                       **quire_hosts.source_options())

            with distributed.get_task_stream(client=dc) as tasks:
                first = query()
                done = first.process_all_available()
                assert len(done) > 1  # maxBytesPerTrigger: several micro-batches
                assert _output(client)[0] == want  # the first wave, exactly

                _append(client, _events(300, 150, range(10, 13), 5), want)
                crashed = first.run_batch()
                assert crashed is not None
                first.stop()
                # A driver killed after the batch's append, before its commit:
                (checkpoint / "commits" / str(crashed.batch_id)).unlink()
                _append(client, _events(450, 200, range(20, 22), 4), want)  # while it is down
                second = query()
                rest = second.process_all_available()
                second.stop()
            ran_on = {str(t["worker"]).removeprefix("tcp://").rpartition(":")[0]
                      for t in tasks.data}
        got, batches = _output(client)
    assert done[0].parts > done[0].tails  # the first wave's history: read from S3
    assert any(r.tails for r in done + rest)  # unpersisted tails: from the coordinators
    assert rest[0].batch_id == crashed.batch_id and rest[0].rerun
    assert len(rest) > 1 and not any(r.rerun for r in rest[1:])
    assert rest[0].appended == crashed.appended  # answered with the first append's commit
    assert got == want  # nothing lost, nothing twice
    assert sorted(set(batches)) == list(range(rest[-1].batch_id + 1))
    assert ran_on == {h[5].address, h[6].address}
    print(f"{len(done)} + {len(rest)} micro-batches; {os.getloadavg()[0]:.1f} load")
