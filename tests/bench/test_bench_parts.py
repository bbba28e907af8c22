"""The bench's parts: shapes and keys of the figures, never how fast anything ran
(speed is reported by `quire bench`, not asserted by tests)."""

from __future__ import annotations

import json

import pytest

from bench.limits import loopback_mbps, loopback_rtt, sha1_mbps
from bench.main import CONCURRENCY, REPLICATION, SIZES, ratios, render
from bench.matrix import json_message
from bench.peers import BenchRedis, measure_redis, size_name, xadd_pipelined, xadd_sync

pytestmark = pytest.mark.timeout(120)


def test_json_messages_are_exact_lines() -> None:
    for i in (0, 7, 123_456_789):
        m = json_message(i)
        assert len(m) == 100 and m.endswith(b"\n")
        assert json.loads(m)["id"] == i
    assert len(json_message(1, 300)) == 300


def test_size_names() -> None:
    assert [size_name(s) for s in (100, 1024, 65536, 1 << 20)] == ["100b", "1k", "64k", "1m"]


def test_sha1_and_loopback_report_positive_rates() -> None:
    assert sha1_mbps(1 << 16, max_bytes=4 << 20, max_seconds=0.2, reps=1) > 0
    assert loopback_mbps(seconds=0.2, max_bytes=64 << 20, reps=1) > 0
    rtt = loopback_rtt(4, seconds=0.2, max_ops=2000)
    assert rtt["ops_per_s"] > 0 and rtt["p99_us"] >= rtt["p50_us"] > 0


def test_redis_peer_runs_with_aof_everysec() -> None:
    with BenchRedis() as srv:
        assert "--appendfsync" in srv.build_argv() and "everysec" in srv.build_argv()
        with srv.client() as r:
            assert r.config_get("appendonly")["appendonly"] == "yes"
            res = xadd_sync(r, 1024, seconds=0.2, max_ops=200)
            assert 0 < res["n"] <= 200 and res["p99_ms"] >= res["p50_ms"]
            res = xadd_pipelined(r, 1 << 20, seconds=0.2, max_ops=20)
            assert res["depth"] == 8 and res["n"] <= 20  # a pipeline holds at most 8 MiB
            assert r.exists("bench") == 0  # each case cleans up its stream


def test_measure_redis_keys() -> None:
    fig = measure_redis((100,), (1, 8), seconds=0.1)
    for key in ("redis_100b_sync_ops", "redis_100b_sync_p99_ms", "redis_100b_pipe_ops",
                "redis_100b_c8_ops", "redis_100b_c8_p50_ms"):
        assert fig[key] > 0
    assert "redis_100b_c1_ops" not in fig  # concurrency 1 is the sync case


def _figures() -> dict[str, float]:
    fig: dict[str, float] = {"sha1_1m_mbps": 1000.0, "loopback_tcp_mbps": 2000.0,
                             "quire_appendservice_100b_r3_msgs": 50_000.0,
                             "redis_100b_pipe_ops": 100_000.0}
    for size in SIZES:
        fig[f"redis_{size_name(size)}_sync_ops"] = 100.0
        for c in CONCURRENCY[1:]:
            fig[f"redis_{size_name(size)}_c{c}_ops"] = 200.0
        for r in REPLICATION:
            for c in CONCURRENCY:
                fig[f"quire_r{r}_{size_name(size)}_c{c}_ops"] = 50.0
                fig[f"quire_r{r}_{size_name(size)}_c{c}_mbps"] = 100.0
    return fig


def test_ratios_pair_like_with_like() -> None:
    out = ratios(_figures())
    assert out["ratio_quire_r3_1k_c1_vs_redis"] == pytest.approx(0.5)   # vs unpipelined
    assert out["ratio_quire_r3_1k_c64_vs_redis"] == pytest.approx(0.25)  # vs 64 concurrent
    assert out["ratio_quire_r1_1m_c8_vs_sha1"] == pytest.approx(0.1)
    assert out["ratio_quire_r1_64k_c8_vs_loopback"] == pytest.approx(0.05)
    assert out["ratio_appendservice_vs_redis_pipe"] == pytest.approx(0.5)
    assert len(out) == len(SIZES) * len(REPLICATION) * len(CONCURRENCY) * 3 + 1


def test_ratios_skip_missing_figures() -> None:
    assert ratios({}) == {}


def test_render_prints_every_case() -> None:
    from rich.console import Console

    console = Console(record=True, width=200)
    render({**_figures(), **ratios(_figures())}, console)
    text = console.export_text()
    assert "quire/redis" in text and "0.25" in text and "50,000" in text
