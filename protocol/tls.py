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
from .ktls import ktls_status

__all__ = ["TLSRefused", "cert_not_after", "client_context", "handshake_refusal",
           "server_context", "settings_client_ssl"]

CERT_VARS = "QUIRE_TLS_CERT and QUIRE_TLS_KEY"
"""What gives a client its certificate (protocol/config.py; docs/security.md)."""
CA_VAR = "QUIRE_TLS_CA"

# OpenSSL's reasons for a handshake the server ended over our certificate (TLS 1.2 ends
# it inside the handshake; with TLS 1.3 the client has finished by then and only sees
# the connection close or reset at its first read: handshake_refusal handles both).
_CERT_ALERTS = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA",
                "CERTIFICATE_UNKNOWN", "HANDSHAKE_FAILURE", "ACCESS_DENIED")


class TLSRefused(ConnectionError):
    """A coordinator refused the TLS handshake (or a plain-TCP client at a TLS port):
    the message says why and which variable to set."""


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
    _enable_ktls(ctx)
    return ctx


def _enable_ktls(ctx: ssl.SSLContext) -> None:
    """Ask OpenSSL for kernel TLS where kernel and Python both offer it (protocol/ktls.py);
    it applies to TLS over plain sockets, not to asyncio's memory BIOs."""
    if ktls_status().usable:
        ctx.options |= ssl.OP_ENABLE_KTLS  # type: ignore[attr-defined]  # Python ≥ 3.12


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
    ctx.presents_cert = bool(cert)  # type: ignore[attr-defined]  # for handshake_refusal
    _enable_ktls(ctx)
    return ctx


def handshake_refusal(exc: BaseException, ctx: ssl.SSLContext | None, *,
                      at_hello: bool) -> TLSRefused | None:
    """What a failed connection to a coordinator means when TLS is why, naming the
    variable to set; None when it is not a TLS matter. `at_hello`: the connection (and
    TLS handshake, if any) was made and then closed before the answer to Hello."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSRefused(f"the coordinator's certificate is not trusted ({exc.verify_message}; "
                          f"set {CA_VAR} to the CA that signed it)")
    reason = str(getattr(exc, "reason", "") or "").upper() if isinstance(exc, ssl.SSLError) else ""
    alert = any(a in reason for a in _CERT_ALERTS)
    closed = at_hello and (isinstance(exc, (ConnectionError, EOFError))
                           or type(exc).__name__ == "ConnectionClosed")
    # Over TLS 1.3 a coordinator that refuses our certificate closes (or resets) the
    # connection right after the handshake; a draining one refuses new connections
    # instead, so a close before the answer to Hello is the certificate.
    if ctx is not None and (alert or closed) and getattr(ctx, "presents_cert", True):
        return TLSRefused(f"TLS handshake refused: the coordinator did not accept the client "
                          f"certificate presented (not of a CA it trusts; set {CERT_VARS} "
                          f"to one of the cluster's)")
    if ctx is not None and (alert or closed):
        return TLSRefused(f"TLS handshake refused: the coordinator requires a client certificate "
                          f"and none was presented (set {CERT_VARS})")
    if ctx is None and closed:
        return TLSRefused(f"closed without answering Hello, as a coordinator serving TLS does to "
                          f"a plain-TCP client (set {CA_VAR}, and {CERT_VARS} if it requires "
                          f"client certificates)")
    return None


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

