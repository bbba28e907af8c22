"""`python -m bench.cpu`: quire and the reference measured side by side, CPU per process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cpu import main

pytestmark = pytest.mark.timeout(180)


def test_cpu_per_append_of_every_process_beside_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    assert main(["--seconds", "0.5", "--rounds", "1", "--conc", "4", "--json", str(out)]) == 0
    fig = json.loads(out.read_text())
    (one,) = fig["rounds"]
    quire, ref = one["quire"], one["pipeline"]
    assert quire["ops_per_s"] > 0 and ref["ops_per_s"] > 0 and one["quire"]["ratio_vs_pipeline"] > 0
    assert {"primary", "client", "total"} <= set(quire["cpu_us_per_append"])
    assert len([k for k in quire["cpu_us_per_append"] if k.startswith("replica-")]) == 2
    assert set(ref["cpu_us_per_append"]) == {"primary", "replica-1", "replica-2", "client", "total"}
    assert all(v >= 0 for v in (*quire["cpu_us_per_append"].values(), *ref["cpu_us_per_append"].values()))
    for side in (quire, ref):  # the system part of each process's CPU
        assert all(0 <= side["sys_us_per_append"][k] <= side["cpu_us_per_append"][k] + 0.1
                   for k in side["sys_us_per_append"])
        assert set(side["minor_faults_per_append"]) == set(side["sys_us_per_append"])
        assert all(v >= 0 for v in side["minor_faults_per_append"].values())


def test_many_journals_name_every_coordinator_by_the_journals_it_leads(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    assert main(["--seconds", "0.5", "--rounds", "1", "--conc", "6", "--journals", "3",
                 "--json", str(out)]) == 0
    fig = json.loads(out.read_text())
    assert fig["journals"] == 3
    (one,) = fig["rounds"]
    coords = [k for k in one["quire"]["cpu_us_per_append"] if k.startswith("coord-")]
    assert len(coords) == 3
    assert sum(int(k.rpartition("-p")[2]) for k in coords) == 3  # each journal has one primary
    assert one["quire"]["ops_per_s"] > 0 and one["pipeline"]["ops_per_s"] > 0
