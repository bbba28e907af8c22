"""A local CA and certificates for TLS on a one-machine cluster (`quire up --tls`, tests).

`make_local_ca(dir)` writes, once, `ca.pem` (a self-signed CA), and `node.pem` /
`node-key.pem`: one certificate every local coordinator serves and presents to its
peers (mTLS), naming `localhost` and `127.0.0.1`, usable as server and client
certificate. Keys are written 0600. Uses `cryptography` (a dependency of PyJWT's
optional extras and of moto; pinned in pyproject.toml). For production, issue
certificates from your own CA: see docs/security.md.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LocalCA", "issue_cert", "make_local_ca"]

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class LocalCA:
    ca: str
    cert: str
    key: str


def _write_key(path: Path, key) -> None:  # noqa: ANN001
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)



def _leaf(ca_key: Any, issuer: Any, common_name: str, hosts: tuple[str, ...],
          now: dt.datetime) -> tuple[Any, Any]:
    """A new P-256 key and its certificate signed by `ca_key`: `common_name`, `hosts` as
    IP or DNS names, usable as server and client certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key

def make_local_ca(directory: str | os.PathLike[str], hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> LocalCA:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = LocalCA(str(d / "ca.pem"), str(d / "node.pem"), str(d / "node-key.pem"))
    if all(Path(p).exists() for p in (out.ca, out.cert, out.key)):
        return out
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quire local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + VALIDITY)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert, key = _leaf(ca_key, ca_name, "quire coordinator", hosts, now)
    Path(out.ca).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    Path(out.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(Path(out.key), key)
    _write_key(d / "ca-key.pem", ca_key)  # to issue more (issue_cert), 0600 like every key
    return out


def issue_cert(ca: LocalCA, name: str, common_name: str,
               hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> LocalCA:
    """A certificate `<name>.pem` / `<name>-key.pem` beside the CA, signed by it, with
    `common_name` (etcd takes a client certificate's CN as its user) and `hosts` as
    names; usable as server and client certificate. Made once, kept across runs."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    d = Path(ca.ca).parent
    out = LocalCA(ca.ca, str(d / f"{name}.pem"), str(d / f"{name}-key.pem"))
    if Path(out.cert).exists() and Path(out.key).exists():
        return out
    ca_key_path = d / "ca-key.pem"
    if not ca_key_path.exists():
        raise FileNotFoundError(f"{ca_key_path}: the CA's key is missing (a CA made before "
                                f"it was kept); remove {d} to make a new CA")
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(Path(ca.ca).read_bytes())
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    cert, key = _leaf(ca_key, ca_cert.subject, common_name, hosts, now)
    _write_key(Path(out.key), key)
    Path(out.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return out
