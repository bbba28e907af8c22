"""The replicated peers of `quire bench`, each started for real and driven for a moment:
every shape acknowledges operations without an error, and the summary of repetitions
gives medians and spreads. NATS runs where `make bench` installed nats-server."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from bench.peer_redis_wait import RedisReplicas, RedisWaitDriver
from bench.replicated import kafka_unavailable, ratios, summarize


def test_redis_with_two_replicas_acknowledges_after_wait(tmp_path: Path) -> None:
    async def drive(cluster: RedisReplicas) -> tuple[dict, dict]:
        async with RedisWaitDriver(cluster) as d:
            return (await d.one_in_flight(1024, 4, 0.3), await d.batched(100, 50, 0.3))

    with RedisReplicas(tmp_path) as cluster:
        one, batched = asyncio.run(drive(cluster))
        with cluster.replicas[0].client() as r:
            assert r.info("replication")["role"] == "slave"
    assert one["n"] > 0 and one["errors"] == 0
    assert batched["n"] >= 50 and batched["errors"] == 0
    for res in (one, batched):  # send → acknowledgement at the client, both shapes
        assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["max_ms"]


@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server: `make bench` installs it")
def test_nats_jetstream_r3_acknowledges_every_publish(tmp_path: Path) -> None:
    pytest.importorskip("nats", reason="nats-py: `make bench` installs it")
    from bench.peer_nats import NatsCluster, NatsDriver

    async def drive(urls: list[str]) -> tuple[dict, dict]:
        async with NatsDriver(urls) as d:
            info = await d.js.stream_info("BENCH")
            assert info.config.num_replicas == 3
            return (await d.one_in_flight(65536, 2, 0.3), await d.batched(100, 100, 0.3))

    with NatsCluster(tmp_path) as cluster:
        one, batched = asyncio.run(drive(cluster.urls))
    assert one["n"] > 0 and one["errors"] == 0
    assert batched["n"] > 0 and batched["errors"] == 0
    for res in (one, batched):
        assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["max_ms"]


def test_ratios_and_their_spread() -> None:
    reps = [{"quire_1k_c64_ops": q, "nats_1k_c64_ops": 100.0} for q in (150.0, 250.0, 200.0)]
    summary = summarize([{**r, **ratios(r)} for r in reps])
    assert summary["ratio_quire_r3_1k_c64_vs_nats"] == {"median": 2.0, "min": 1.5, "max": 2.5, "n": 3}
    assert "Kafka" in kafka_unavailable() and "\n" not in kafka_unavailable()
