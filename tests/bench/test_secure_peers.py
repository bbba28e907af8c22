"""`quire bench --secure`: quire with tokens + mTLS against JetStream with TLS, each
started for real and driven for a moment; the ratios and the table from plain values."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from bench.main import render_secure
from bench.replicated import summarize
from bench.secure_peers import SECURE_SHAPES, run_secure, secure_ratios


def test_ratios_per_shape_and_latency() -> None:
    fig = {"quire_tls_64k_c8_ops": 300.0, "nats_tls_64k_c8_ops": 100.0,
           "quire_tls_64k_c8_p99_ms": 5.0, "nats_tls_64k_c8_p99_ms": 10.0,
           "quire_tls_1k_c64_ops": 50.0}  # no JetStream figure: no ratio
    assert secure_ratios(fig) == {"ratio_quire_tls_r3_64k_c8_vs_nats_tls": 3.0,
                                  "ratio_quire_tls_r3_64k_c8_p99_vs_nats_tls": 0.5}


def test_the_table_shows_every_shape() -> None:
    rep = {"quire_tls_64k_c8_ops": 300.0, "nats_tls_64k_c8_ops": 100.0}
    rep.update(secure_ratios(rep))
    out = io.StringIO()
    render_secure({"repeat": 1, "ktls": "kTLS: unavailable (test)",
                   "summary": summarize([rep])}, Console(file=out, width=250))
    text = out.getvalue()
    assert "kTLS: unavailable (test)" in text and "3.00" in text
    assert len(SECURE_SHAPES) == sum(f"x{c}" in text for _, c in SECURE_SHAPES)


@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server: `make bench` installs it")
def test_both_secure_systems_acknowledge_every_shape(tmp_path: Path) -> None:
    pytest.importorskip("nats", reason="nats-py: `make bench` installs it")
    out = run_secure(tmp_path, repeat=1, seconds=0.3)
    assert out["ktls"].startswith("kTLS: ")
    [rep] = out["repetitions"]
    for size, conc in SECURE_SHAPES:
        for system in ("quire_tls", "nats_tls"):
            key = f"{system}_{'1k' if size == 1024 else '64k'}_c{conc}"
            assert rep[f"{key}_ops"] > 0 and f"{key}_errors" not in rep, key
            assert 0 < rep[f"{key}_p50_ms"] <= rep[f"{key}_p99_ms"]
    assert any(k.startswith("ratio_quire_tls_r3_") for k in out["summary"])
