"""The minimal R=3 pipeline quire is measured against (bench/pipeline_ref.py): three real
processes on loopback. Checks that it runs, acknowledges only what both replicas wrote,
and that `quire bench` pairs its figures with quire's — never the size of a figure."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.main import MULTI_CASE, ratios
from bench.pipeline_ref import PipelineRef, ref_case

pytestmark = pytest.mark.timeout(120)


def test_reference_runs_and_every_ack_is_on_both_replicas() -> None:
    with PipelineRef() as ref:
        one = asyncio.run(ref_case(ref, 1024, 8, seconds=5, max_ops=300))
        many = asyncio.run(ref_case(ref, 1024, 8, seconds=5, journals=4, max_ops=200))
        files = {p.name: p.stat().st_size for p in Path(ref._dir.name).iterdir()}
    assert one["n"] == 300 and many["n"] == 200  # bounded by ops, not by time
    for res in (one, many):
        assert res["ops_per_s"] > 0 and res["mbps"] > 0 and res["p99_ms"] >= res["p50_ms"] > 0
    # Every acknowledged byte is in its primary's spool and in both replicas' spools.
    by_journal: dict[str, list[int]] = {}
    for name, size in files.items():
        by_journal.setdefault(name.split("-")[1], []).append(size)
    assert all(len(sizes) == 3 and len(set(sizes)) == 1 for sizes in by_journal.values()), files
    assert sum(sizes[0] for sizes in by_journal.values()) == (300 + 200) * 1024
    # The other journals' primaries are spread over the three processes.
    assert {name.split("-")[0] for name in files if name.startswith("p")} == {"p0", "p1", "p2"}


def test_ratios_pair_quire_with_the_reference_case_by_case() -> None:
    fig = {"quire_r3_64k_c8_ops": 800.0, "pipeline_r3_64k_c8_ops": 1000.0,
           "quire_r3_1k_c64_ops": 4000.0, "pipeline_r3_1k_c64_ops": 16000.0,
           f"quire_{MULTI_CASE}_ops": 9000.0, f"pipeline_{MULTI_CASE}_ops": 18000.0,
           "quire_r3_1k_c1_p99_ms": 3.0, "pipeline_r3_1k_c1_p99_ms": 1.0,
           "pipeline_fresh_r3_64k_c8_ops": 900.0}
    out = ratios(fig)
    assert out["ratio_quire_r3_64k_c8_vs_pipeline_fresh"] == pytest.approx(800 / 900)
    assert out["ratio_quire_r3_64k_c8_vs_pipeline"] == pytest.approx(0.8)
    assert out["ratio_quire_r3_1k_c64_vs_pipeline"] == pytest.approx(0.25)
    assert out[f"ratio_quire_{MULTI_CASE}_vs_pipeline"] == pytest.approx(0.5)
    assert out["ratio_quire_r3_1k_c1_p99_vs_pipeline"] == pytest.approx(3.0)
    assert "ratio_quire_r3_1m_c8_vs_pipeline" not in out  # no figure, no ratio


def test_a_fresh_reference_never_wraps_its_spool_files() -> None:
    """fresh=True: spool files grow with every byte (new page-cache pages, as quire's
    spools in the bench); the default rewrites a window. Both acknowledge on all three."""
    from bench import pipeline_ref

    with PipelineRef() as ref:
        res = asyncio.run(ref_case(ref, 1024, 4, seconds=5, max_ops=100, fresh=True))
        files = {p.name: p.stat().st_size for p in Path(ref._dir.name).iterdir()}
    assert res["n"] == 100
    fresh = {n: size for n, size in files.items() if n.split("-")[1] == f"j{pipeline_ref.FRESH}"}
    assert len(fresh) == 3 and set(fresh.values()) == {100 * 1024}, files
    assert pipeline_ref._wrap(pipeline_ref.FRESH) > pipeline_ref.WRAP == pipeline_ref._wrap(0)
