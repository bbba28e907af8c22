"""The credentials of the secure compose deployment (compose/secure.yml), made on the host:

    python -m tools.compose_secrets make DIR [--owner UID]   (`make compose-secrets`)
    python -m tools.compose_secrets etcd-init --etcd URLS --root /quire   (service etcd-init)

`make` writes, under DIR, what `quire up --secure` makes under its data dir (the same
code: tools/tls_certs.py, tools/secure_cluster.py), for the compose service names:

    DIR/ca/        the CA and its key: never mounted (issue more certificates from it)
    DIR/quire/     -> /run/quire/secrets of every quire container: ca.pem, node.pem /
                   node-key.pem (coordinators serve mTLS with it, clients present it),
                   etcd-quire.pem / -key.pem (CN quire: the etcd user whose role reaches
                   /quire/ only), auth.keys (token signing, task signing), services.token
    DIR/etcd/      -> etcd-1..3 and etcd-init: ca, node certificate, etcd-root.pem (CN root)
    DIR/redis/     -> redis: ca, node certificate, users.acl (SHA-256 of each password;
                   `default` off), health.password (a user that may only PING)
    DIR/operator/  the operator's: ca, node certificate, etcd-quire, admin.token
    DIR/secure.env `docker compose --env-file`: QUIRE_SECURE_DIR, each Redis role's
                   password, MINIO_ROOT_USER/PASSWORD, GRAFANA_ADMIN_PASSWORD

Every key, password and token is mode 0600, every directory 0700, all owned by `--owner`
(default 10001: the quire image's user; Redis and the smoke client run as it too, etcd
as root), so the files are readable only by the containers that mount them. Kept across
runs: an existing DIR is reused (remove it to rotate everything). Nothing here is ever
committed (build/ is ignored).

`etcd-init` runs once in the cluster (compose/secure.yml, before any quire process): as
etcd's root user (the CN root certificate) it makes the `quire` role with readwrite on
the root prefix only, the users `root` and `quire` (no passwords: etcd takes the
certificate's CN as the user) and enables auth. Idempotent.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import secrets
import shutil
import sys
from pathlib import Path

from tools.secure_cluster import REDIS_ROLES
from topology.etcd import prefix_end
from tools.tls_certs import issue_cert, make_local_ca

__all__ = ["COMPOSE_HOSTS", "etcd_init", "make"]

COMPOSE_HOSTS = ("localhost", "127.0.0.1", "etcd-1", "etcd-2", "etcd-3", "redis",
                 "coordinator-a1", "coordinator-a2", "coordinator-b1", "dashboard")
"""The names the node certificate serves (docker-compose.yml's service host names)."""
DEFAULT_OWNER = 10001
HEALTH_RULES = "nocommands +ping"
"""Redis's health check user: PING and nothing else (no key, no channel)."""


class SecretsError(Exception):
    """The secrets directory cannot be made or used (the message says what to do)."""


def _secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _random_file(path: Path, make) -> str:  # noqa: ANN001
    if not path.exists():
        _secret(path, make() + "\n")
    return path.read_text().strip()


def _copy(src: str | Path, dest_dir: Path, name: str | None = None) -> None:
    dest = dest_dir / (name or Path(src).name)
    private = dest.name.endswith(("-key.pem", ".keys", ".token", ".password", ".acl"))
    dest.unlink(missing_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o600 if private else 0o644)


def make(directory: str | os.PathLike[str], owner: int = DEFAULT_OWNER) -> Path:
    """Make (or complete) DIR; returns the path of DIR/secure.env."""
    from protocol.auth import Capability, Scope
    from protocol.credentials import load_keyring

    if os.geteuid() != 0 and owner != os.geteuid():
        raise SecretsError(f"the files must belong to uid {owner} (the containers' user) and "
                           f"only root can give them away: run as root, or pass --owner "
                           f"{os.geteuid()} and run the containers as that uid")
    d = Path(directory).resolve()
    work = d / "ca"
    for sub in ("ca", "quire", "etcd", "redis", "operator"):
        (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d / sub, 0o700)
    os.chmod(d, 0o700)
    ca = make_local_ca(work, hosts=COMPOSE_HOSTS)
    etcd_quire = issue_cert(ca, "etcd-quire", "quire")
    etcd_root = issue_cert(ca, "etcd-root", "root")
    _random_file(work / "auth.keys", lambda: base64.b64encode(os.urandom(32)).decode())
    passwords = {role: _random_file(work / f"redis-{role}.password", lambda: secrets.token_urlsafe(24))
                 for role in (*REDIS_ROLES, "health")}
    minio = _random_file(work / "minio.password", lambda: secrets.token_urlsafe(24))
    grafana = _random_file(work / "grafana.password", lambda: secrets.token_urlsafe(18))
    ring = load_keyring(None, str(work / "auth.keys"))
    assert ring is not None
    every = Scope.of(["*"])
    # Services: list/read/append everywhere (workers fetch, the dashboard lists, the
    # consumer reads and commits); the operator: every capability. 7 days (the most a
    # token may live): `make` again re-mints both (tokens are rotated, not kept).
    _secret(work / "services.token",
            ring.mint(Capability.LIST | Capability.READ | Capability.APPEND, every, 7 * 86400,
                      "compose-services") + "\n")
    _secret(work / "admin.token", ring.mint(Capability(sum(Capability)), every, 7 * 86400,
                                            "compose-operator") + "\n")
    acl = ["user default off"]
    for role, rules in {**REDIS_ROLES, "health": HEALTH_RULES}.items():
        acl.append(f"user quire-{role} on #{hashlib.sha256(passwords[role].encode()).hexdigest()} {rules}")
    _secret(work / "users.acl", "\n".join(acl) + "\n")

    node = (ca.ca, ca.cert, ca.key)
    for f in (*node, etcd_quire.cert, etcd_quire.key, work / "auth.keys", work / "services.token"):
        _copy(f, d / "quire")
    for f in (*node, etcd_root.cert, etcd_root.key):
        _copy(f, d / "etcd")
    for f in (*node, work / "users.acl"):
        _copy(f, d / "redis")
    _copy(work / "redis-health.password", d / "redis", "health.password")
    for f in (*node, etcd_quire.cert, etcd_quire.key, work / "admin.token"):
        _copy(f, d / "operator")
    env = d / "secure.env"
    _secret(env, "".join(f"{k}={v}\n" for k, v in {
        "QUIRE_SECURE_DIR": str(d),
        **{f"QUIRE_REDIS_{role.upper()}_PASSWORD": passwords[role] for role in REDIS_ROLES},
        "MINIO_ROOT_USER": "quire", "MINIO_ROOT_PASSWORD": minio,
        "GRAFANA_ADMIN_USER": "admin", "GRAFANA_ADMIN_PASSWORD": grafana}.items()))
    if os.geteuid() == 0:
        for path in [d, *d.rglob("*")]:
            os.chown(path, owner, owner)
    return env


async def etcd_init(urls: str, root: str, timeout: float = 120.0) -> None:
    """The RBAC bootstrap of tools.secure_cluster.bootstrap_etcd, over etcd's gRPC API
    (etcd's own images have no shell to run etcdctl steps with)."""
    import grpc
    from aetcd import rpc
    from aetcd.rpc.auth_pb2 import Permission, UserAddOptions

    from topology.etcd_client import EtcdClient, EtcdTLS, parse_endpoints

    tls = EtcdTLS.from_env()
    if tls is None or tls.cert is None:
        raise SecretsError("etcd-init needs the root user's certificate: QUIRE_ETCD_CA, "
                           "QUIRE_ETCD_CERT, QUIRE_ETCD_KEY")
    prefix = root.rstrip("/") + "/"
    client = EtcdClient(parse_endpoints(urls), tls=tls)
    try:
        await client.connect()
        stub = client.auth_stub
        nopw = UserAddOptions(no_password=True)
        steps = [("user add root", stub.UserAdd, rpc.AuthUserAddRequest(
                     name="root", options=nopw)),
                 ("grant root to root", stub.UserGrantRole, rpc.AuthUserGrantRoleRequest(user="root", role="root")),
                 ("role add quire", stub.RoleAdd, rpc.AuthRoleAddRequest(name="quire")),
                 (f"grant readwrite {prefix} to quire", stub.RoleGrantPermission,
                  rpc.AuthRoleGrantPermissionRequest(name="quire", perm=Permission(
                      permType=Permission.READWRITE, key=prefix.encode(), range_end=prefix_end(prefix.encode())))),
                 ("user add quire", stub.UserAdd, rpc.AuthUserAddRequest(name="quire", options=nopw)),
                 ("grant quire to quire", stub.UserGrantRole, rpc.AuthUserGrantRoleRequest(user="quire", role="quire")),
                 ("auth enable", stub.AuthEnable, rpc.AuthEnableRequest())]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for what, call, request in steps:
            while True:
                try:
                    await call(request, timeout=10)
                    print(f"etcd-init: {what}", flush=True)
                    break
                except grpc.aio.AioRpcError as exc:
                    if "already exists" in (exc.details() or ""):
                        print(f"etcd-init: {what}: already done", flush=True)
                        break
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                            and loop.time() < deadline:
                        client.fail_over(exc.details() or "unavailable")
                        await client.connect()
                        stub = client.auth_stub
                        await asyncio.sleep(1.0)
                        continue
                    raise SecretsError(f"etcd-init: {what}: {exc.code().name}: {exc.details()}") from None
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compose_secrets", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="make (or complete) the secrets directory")
    mk.add_argument("directory")
    mk.add_argument("--owner", type=int, default=DEFAULT_OWNER, help="uid (and gid) of every file")
    init = sub.add_parser("etcd-init", help="etcd's users, the quire role, auth on (in the cluster)")
    init.add_argument("--etcd", required=True)
    init.add_argument("--root", default="/quire")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "make":
            env = make(args.directory, args.owner)
            print(f"secrets under {env.parent}; use: docker compose -f compose/docker-compose.yml "
                  f"-f compose/secure.yml --env-file {env} up -d")
        else:
            asyncio.run(etcd_init(args.etcd, args.root))
    except SecretsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
