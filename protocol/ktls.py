"""Kernel TLS (kTLS): whether this machine could hand TLS record crypto to the kernel.

Two things must hold, and `ktls_status()` checks both and says which one failed:

  * the kernel offers the `tls` upper-layer protocol: `/proc/sys/net/ipv4/tcp_available_ulp`
    lists it, or — the module may load on first use — `setsockopt(TCP_ULP, "tls")`
    succeeds on a connected loopback socket;
  * Python's ssl module can ask OpenSSL for it: `ssl.OP_ENABLE_KTLS` exists (Python ≥ 3.12)
    and OpenSSL is 3.x (only an OpenSSL built with `enable-ktls` then uses it).

When both hold, protocol/tls.py sets `OP_ENABLE_KTLS` on its contexts, which takes effect
on TLS over a plain socket; asyncio and uvloop run TLS through memory BIOs, which stay
the path for coordinator connections either way (docs/security.md).
"""

from __future__ import annotations

import errno
import socket
import ssl
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["KtlsStatus", "ktls_status", "kernel_tls_ulp"]

ULP_FILE = Path("/proc/sys/net/ipv4/tcp_available_ulp")
TCP_ULP = getattr(socket, "TCP_ULP", 31)


@dataclass(frozen=True)
class KtlsStatus:
    kernel: bool
    python: bool
    usable: bool
    reason: str

    def line(self) -> str:
        """`kTLS: available (...)` or `kTLS: unavailable (reason)`, one line."""
        return f"kTLS: {'available' if self.usable else 'unavailable'} ({self.reason})"


def kernel_tls_ulp(ulp_file: Path = ULP_FILE) -> tuple[bool, str]:
    """(offered, how it was found out) for the kernel's `tls` ULP."""
    try:
        listed = ulp_file.read_text().split()
    except OSError:
        listed = None
    if listed is not None and "tls" in listed:
        return True, f"{ulp_file} lists tls"
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=2.0) as sock:
            accepted, _ = server.accept()
            accepted.close()
            try:
                sock.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
            except OSError as exc:
                why = {errno.ENOENT: "the kernel has no tls ULP (module tls not loaded)",
                       errno.EPERM: "setting the tls ULP is not permitted here"}.get(
                    exc.errno, f"setsockopt(TCP_ULP, tls): {exc.strerror or exc}")
                shown = f"{ulp_file} lists {' '.join(listed) or 'nothing'}; " if listed is not None else ""
                return False, shown + why
        return True, "setsockopt(TCP_ULP, tls) succeeded on a loopback socket"
    except OSError as exc:
        return False, f"could not probe the tls ULP: {exc}"
    finally:
        server.close()


def _python_ktls() -> tuple[bool, str]:
    if not hasattr(ssl, "OP_ENABLE_KTLS"):
        import platform

        return False, f"Python {platform.python_version()}'s ssl has no OP_ENABLE_KTLS (needs ≥ 3.12)"
    if ssl.OPENSSL_VERSION_INFO[0] < 3:
        return False, f"{ssl.OPENSSL_VERSION} predates kTLS support (needs OpenSSL 3)"
    return True, f"ssl.OP_ENABLE_KTLS with {ssl.OPENSSL_VERSION}"


@lru_cache(maxsize=1)
def ktls_status() -> KtlsStatus:
    """Both checks, once per process."""
    kernel, kwhy = kernel_tls_ulp()
    python, pwhy = _python_ktls()
    if kernel and python:
        reason = f"{kwhy}; {pwhy}"
    else:
        reason = "; ".join(w for ok, w in ((kernel, kwhy), (python, pwhy)) if not ok)
    return KtlsStatus(kernel=kernel, python=python, usable=kernel and python, reason=reason)
