"""bench.secure runs end to end (figures are reported, never asserted)."""

from __future__ import annotations

import pytest

from bench.secure import secure_figures

pytestmark = pytest.mark.timeout(420)


def test_secure_figures_smoke() -> None:
    fig = secure_figures(seconds=0.3, rounds=1)
    for name in ("plain", "auth", "tls", "secure"):
        assert fig[name]["appends"] > 0
    assert set(fig["ratios"]) == {"auth_vs_plain", "tls_vs_plain", "secure_vs_plain"}
