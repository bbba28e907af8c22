"""protocol/ktls.py: the kernel's tls ULP and Python's kTLS option, each said with why."""

from __future__ import annotations

import ssl
from pathlib import Path

from protocol.ktls import kernel_tls_ulp, ktls_status


def test_a_listed_tls_ulp_is_taken_at_its_word(tmp_path: Path) -> None:
    f = tmp_path / "tcp_available_ulp"
    f.write_text("mptcp tls\n")
    assert kernel_tls_ulp(f) == (True, f"{f} lists tls")


def test_unlisted_falls_back_to_a_loopback_probe(tmp_path: Path) -> None:
    f = tmp_path / "tcp_available_ulp"
    f.write_text("mptcp\n")
    offered, why = kernel_tls_ulp(f)
    # Either answer is this machine's; the reason names what was found.
    assert ("setsockopt" in why) if offered else ("mptcp" in why and why)


def test_status_line_names_every_missing_piece() -> None:
    st = ktls_status()
    assert st.usable == (st.kernel and st.python)
    line = st.line()
    assert line.startswith("kTLS: available (" if st.usable else "kTLS: unavailable (")
    if not hasattr(ssl, "OP_ENABLE_KTLS"):
        assert not st.usable and "OP_ENABLE_KTLS" in line
