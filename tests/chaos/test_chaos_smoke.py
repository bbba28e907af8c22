"""`quire chaos --duration 60` end to end: a real cluster, real faults, zero anomalies —
the brokers' and the consumer group's (count shards, kill-consumer / pause-consumer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.checker import SAFETY_KEYS
from chaos.cluster import coordinator_available

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not coordinator_available(),
                       reason="the coordinator package (coordinator.main) is not present yet"),
]


def test_chaos_smoke_60s_is_safe(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.main", "--duration", "60", "--seed", "1", "--json", str(out),
         "--workdir", str(tmp_path / "cluster")],  # pytest's tmp_path, not a kept /tmp dir
        capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert out.exists(), f"no summary written (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads(out.read_text())
    safety = summary["safety"]
    assert set(safety) == set(SAFETY_KEYS)
    assert all(v == 0 for v in safety.values()), (safety, summary["examples"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert summary["appends"]["acknowledged"] > 0
    assert summary["run"]["workdir"] == str(tmp_path / "cluster")
    assert sum(summary["faults"].values()) > 0
    # No coordinator caught an exception it did not expect (tools/log_crashes.py).
    assert summary["counts"]["caught_crashes"] == 0, summary["examples"].get("caught_crashes")
    # Identified (exactly-once) writers by default, and duplicates counted explicitly.
    assert summary["run"]["identified_writers"] is True
    assert "duplicates: 0  (writers: identified" in proc.stdout, proc.stdout[-3000:]
    # The consumer group ran, was faulted, and its committed counts equal the model.
    counts = summary["counts"]
    assert counts["consumer_keys"] > 0 and counts["consumer_messages"] > 0, counts
    assert counts["consumer_watch_polls"] > 20, counts
    assert summary["faults"].get("kill-consumer", 0) + summary["faults"].get("pause-consumer", 0) >= 1
    for key in ("consumer_mismatches", "consumer_overcounted", "consumer_undercounted",
                "consumer_dual_primaries", "consumer_zombie_commits"):
        assert safety[key] == 0, (key, summary["examples"].get(key))
    assert "consumer_mismatches=0" in proc.stdout, proc.stdout[-3000:]
