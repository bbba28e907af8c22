"""TLS contexts for coordinator sockets (optional; docs/security.md).

A coordinator serves TLS when it has a certificate and key; with `client_auth` it also
demands a client certificate chaining to its CA (mTLS), which is how peers prove they
are coordinators. Clients and peers verify the coordinator's certificate against a CA
bundle, hostname included (certificates for loopback clusters name 127.0.0.1).
TLS 1.2 is the floor. Tokens still apply on top: TLS says who the peer is and keeps
tokens secret on the wire; tokens say what the bearer may do.
"""

from __future__ import annotations

import ssl

from .errors import ValidationError

__all__ = ["cert_not_after", "client_context", "server_context"]


def server_context(cert: str, key: str, ca: str | None = None,
                   client_auth: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if ca:
            ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValidationError("tls_cert", f"cannot load {cert} / {key}: {exc}") from None
    if client_auth:
        if not ca:
            raise ValidationError("tls_ca", "client certificate auth needs a CA bundle")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """Verify coordinators against `ca`; present `cert`/`key` if given (mTLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValidationError("tls_ca", f"cannot load {ca}: {exc}") from None
    return ctx


def settings_client_ssl(settings: object) -> ssl.SSLContext | None:
    """The client context a process uses toward coordinators, from its settings:
    None (plain TCP) unless `tls_ca` is set; `tls_cert`/`tls_key`, if set, are presented
    (needed when coordinators require client certificates)."""
    ca = getattr(settings, "tls_ca", None)
    if not ca:
        return None
    return client_context(ca, getattr(settings, "tls_cert", None), getattr(settings, "tls_key", None))


def cert_not_after(path: str) -> float:
    """Unix time after which the first certificate in the PEM file `path` is no longer
    valid (its notAfter). Raises ValueError naming the file if it cannot be read."""
    try:
        from cryptography import x509

        with open(path, "rb") as fh:
            cert = x509.load_pem_x509_certificate(fh.read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the certificate {path}: {exc}") from None
    after = getattr(cert, "not_valid_after_utc", None)  # cryptography >= 42
    if after is None:
        import datetime

        after = cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)
    return after.timestamp()

