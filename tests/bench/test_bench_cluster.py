"""The quire side of the bench against a real 3-coordinator cluster, tiny and bounded:
it checks the figures exist and no append failed, never their size."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.matrix import append_case, message_rate
from bench.rss import measure_rss
from chaos.cluster import LocalCluster, coordinator_available
from quire.client import Client
from protocol import Codec, FragmentSpec, JournalSpec

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not coordinator_available(), reason="coordinator.main is not present yet"),
]


def test_append_matrix_and_messages(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri() + "/"
    (tmp_path / "store").mkdir()

    async def run(cluster: LocalCluster) -> tuple[dict, dict]:
        client = Client(cluster.endpoints, retry_timeout=30)
        try:
            names = ["bench/t3", "bench/t3-b"]
            await client.apply([JournalSpec(name=n, replication=3, fragment=FragmentSpec(
                stores=(store,), compression_codec=Codec.NONE)) for n in names])
            for n in names:
                await client.append(n, b"", retry_timeout=60)
            case = await append_case(client, "bench/t3", 1024, 8, seconds=0.5, max_ops=400)
            msgs = await message_rate(client, "bench/t3", seconds=0.5, max_messages=5000)
            head = await client.write_head("bench/t3")
            # Several journals: task i appends to journal i mod 2.
            many = await append_case(client, names, 1024, 8, seconds=5, max_ops=100)
            assert many["errors"] == 0 and many["n"] == 100, many
            grown = [await client.write_head(names[0]) - head, await client.write_head(names[1])]
            assert grown[0] > 0 and grown[1] > 0 and sum(grown) == 100 * 1024, grown
            return case, {**msgs, "head": head}
        finally:
            await client.close()

    with LocalCluster(3, zones=("zone-a", "zone-b"), workdir=tmp_path / "cluster") as cluster:
        case, msgs = asyncio.run(run(cluster))
    assert case["errors"] == 0, case["first_error"]
    assert 0 < case["n"] <= 400 and case["p99_ms"] >= case["p50_ms"] > 0
    assert msgs["errors"] == 0 and 0 < msgs["n"] <= 5000
    assert msgs["head"] == case["n"] * 1024 + msgs["n"] * 100


def test_rss_steps(tmp_path: Path) -> None:
    fig = measure_rss(tmp_path, steps=(1, 20), settle=0.2)
    assert "rss_error" not in fig, fig
    assert fig["rss_0_journals_mb"] > 0 and fig["rss_20_journals_mb"] > 0
