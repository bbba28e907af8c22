"""bench.recv runs its three receivers over plain TCP and TLS and reports what it says."""

from __future__ import annotations

from bench.recv import recv_figures


def test_recv_figures_report_every_receiver_on_both_transports() -> None:
    fig = recv_figures(frames=200, size=16 << 10, repeat=1)
    for transport in ("plain", "tls"):
        f = fig[transport]
        for kind in ("raw", "frames", "streams"):
            assert f[f"{kind}_us_per_frame"] > 0
            assert len(f["runs"][kind]) == 1
        assert f["ratio"] > 0 and f["vs_streams"] > 0
