"""What `quire up --secure` adds to `--auth --tls`: every other channel locked.

- **etcd** serves TLS on client and peer URLs and takes only client certificates signed
  by the cluster CA (`--client-cert-auth`); at first start a `root` user (root role) and a
  `quire` user whose `quire` role has readwrite on the cluster's root prefix only are
  made, then auth is enabled. Users have no password: etcd takes a certificate's common
  name as its user, so `etcd-quire.pem` (CN quire) is what every quire process presents
  and `etcd-root.pem` (CN root) is the operator's.
- **Redis** serves TLS only (`--port 0 --tls-port`), its `default` user is off, and each
  role has its own ACL user with a random password: `quire-worker` (the workers: every
  queue, results, the index cache), `quire-beat` (enqueues the maintenance sweeps; also
  the operator CLI's user for `journals delete --purge` / `journals prune`), and
  `quire-coordinator` (enqueues persist tasks only, reads the index cache).
- **Celery messages** are signed with the cluster's keys (auth is on), destructive ones
  carry an APPLY token: protocol/task_signing.py, workers/signing.py.

Everything is made once under `<data-dir>/secure/` and `<data-dir>/tls/` (keys and
passwords 0600) and kept across runs, like the CA and the token key.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from tools.tls_certs import LocalCA, issue_cert

__all__ = ["REDIS_ROLES", "SecureFiles", "bootstrap_etcd", "prepare", "redis_url"]

REDIS_ROLES: dict[str, str] = {
    # role -> ACL rules (after `on #sha256`). No role may run admin or dangerous commands
    # (flush, config, debug…); beat and coordinators reach only their queues (`name*`:
    # kombu's priority lists are `<queue>\x06\x16<n>`), the routing tables and, for
    # coordinators, the index cache; only workers read unacked messages and locks.
    "worker": "~* &* +@all -@admin -@dangerous +client|setname +client|id "
              "+info +keys +ping",
    "beat": "~index* ~pulse* ~prune* ~jobs* ~celery* ~_kombu.binding* &* "
            # read-only: what `quire journals list --stats` shows the operator (whose
            # QUIRE_REDIS_URL is this user's): watermarks, backlog, persist failures
            "%R~quire:watermarks %R~quire:persist-* "
            "+@all -@admin -@dangerous +client|setname +client|id +ping",
    "coordinator": "~persist* ~_kombu.binding* ~quire:index* ~quire:persist-backlog* &* "
                   "+@all -@admin -@dangerous +client|setname +client|id +ping",
}


@dataclass(frozen=True)
class SecureFiles:
    ca: LocalCA
    """The cluster CA and the node certificate (coordinators, etcd and Redis serve it)."""
    etcd_quire: LocalCA
    """Client certificate with CN `quire`: every quire process's etcd user."""
    etcd_root: LocalCA
    """Client certificate with CN `root`: the operator's (and the bootstrap's)."""
    redis_passwords: dict[str, str]
    aclfile: str
    directory: Path


def _write_secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def prepare(data_dir: Path, ca: LocalCA) -> SecureFiles:
    """Certificates, Redis passwords and the ACL file (made once, kept across runs)."""
    d = data_dir / "secure"
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    passwords: dict[str, str] = {}
    for role in REDIS_ROLES:
        path = d / f"redis-{role}.password"
        if not path.exists():
            _write_secret(path, secrets.token_urlsafe(24) + "\n")
        passwords[role] = path.read_text().strip()
    acl = d / "redis-users.acl"
    # Redis keeps only the SHA-256 of each password (`#<hash>`); `default` is off.
    import hashlib

    lines = ["user default off"]
    for role, rules in REDIS_ROLES.items():
        digest = hashlib.sha256(passwords[role].encode()).hexdigest()
        lines.append(f"user quire-{role} on #{digest} {rules}")
    _write_secret(acl, "\n".join(lines) + "\n")
    return SecureFiles(ca=ca, etcd_quire=issue_cert(ca, "etcd-quire", "quire"),
                       etcd_root=issue_cert(ca, "etcd-root", "root"),
                       redis_passwords=passwords, aclfile=str(acl), directory=d)


def redis_url(files: SecureFiles, port: int, role: str, db: int = 0) -> str:
    """`rediss://quire-<role>:<password>@127.0.0.1:<port>/<db>?ssl_ca_certs=<ca>`."""
    password = urllib.parse.quote(files.redis_passwords[role], safe="")
    return (f"rediss://quire-{role}:{password}@127.0.0.1:{port}/{db}"
            f"?ssl_ca_certs={urllib.parse.quote(files.ca.ca)}")


def etcdctl(url: str, who: LocalCA, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """`etcdctl` against `url` as the user of certificate `who`."""
    exe = shutil.which("etcdctl")
    if exe is None:
        raise FileNotFoundError("etcdctl not found on PATH; install the Debian package etcd-client")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return subprocess.run([exe, f"--endpoints={url}", f"--cacert={who.ca}", f"--cert={who.cert}",
                           f"--key={who.key}", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def bootstrap_etcd(url: str, files: SecureFiles, root: str) -> None:
    """At first start (auth still off): the root user, the `quire` role with readwrite on
    `<root>/` only and the `quire` user, then auth on. A no-op once auth is on."""
    status = etcdctl(url, files.etcd_root, "auth", "status")
    if status.returncode == 0 and "Authentication Status: true" in status.stdout:
        return
    prefix = root.rstrip("/") + "/"
    steps = [("user", "add", "root", "--no-password"), ("user", "grant-role", "root", "root"),
             ("role", "add", "quire"),
             ("role", "grant-permission", "quire", "readwrite", prefix, "--prefix=true"),
             ("user", "add", "quire", "--no-password"), ("user", "grant-role", "quire", "quire"),
             ("auth", "enable")]
    for step in steps:
        res = etcdctl(url, files.etcd_root, *step)
        if res.returncode != 0 and "already exists" not in res.stderr:
            raise RuntimeError(f"etcd RBAC bootstrap: etcdctl {' '.join(step)}: "
                               f"{(res.stderr or res.stdout).strip()[:300]}")
