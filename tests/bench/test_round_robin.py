"""`python -m bench.round_robin`: every N in one cluster, alternated, rates and CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.round_robin import main

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("cold", [False, True])
def test_every_n_in_one_cluster_with_its_ratio_and_cpu(tmp_path: Path, cold: bool) -> None:
    out = tmp_path / "rr.json"
    argv = ["--journals", "2", "5", "--seconds", "0.5", "--rounds", "2", "--json", str(out)]
    assert main(argv + (["--cold"] if cold else [])) == 0
    fig = json.loads(out.read_text())
    assert fig["cold"] is cold and len(fig["rounds"]) == 2
    for row in fig["rounds"]:
        assert [f["journals"] for f in row] == [2, 5]
        assert row[0]["ratio"] == 1.0 and row[1]["ratio"] > 0
        for f in row:
            assert f["appends"] > 0 and f["appends_per_s"] > 0
            assert len([k for k in f["cpu_us_per_append"] if k != "client"]) == 3
            assert all(v >= 0 for v in f["cpu_us_per_append"].values())
