"""`quire_tls_cert_expiry_timestamp_seconds`: the notAfter of the certificates a coordinator
serves, read from the PEM files it loads (the QuireCertificateExpiresSoon alert's input)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from coordinator.metrics import watch_cert
from protocol.tls import cert_not_after
from tools.tls_certs import VALIDITY, make_local_ca


def test_not_after_of_a_local_ca_and_its_node_certificate(tmp_path) -> None:  # noqa: ANN001
    ca = make_local_ca(tmp_path)
    expected = time.time() + VALIDITY.total_seconds()
    for path in (ca.ca, ca.cert):  # (valid from a few minutes back, for clock skew)
        assert abs(cert_not_after(path) - expected) < 900, path
    watch_cert("server", ca.cert)
    got = REGISTRY.get_sample_value("quire_tls_cert_expiry_timestamp_seconds",
                                    {"use": "server", "path": ca.cert})
    assert got == cert_not_after(ca.cert)


def test_an_unreadable_certificate_is_named(tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ValueError, match=str(bad)):
        cert_not_after(str(bad))
    watch_cert("server", str(bad))  # logged, not raised: the coordinator still starts
    assert REGISTRY.get_sample_value("quire_tls_cert_expiry_timestamp_seconds",
                                     {"use": "server", "path": str(bad)}) is None
