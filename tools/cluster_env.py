"""What every process of a local cluster runs with (local_cluster.py): the cluster's
addresses as QUIRE_* variables, the client's block of them (`quire up` prints it, `quire
env` reads it back from <data-dir>/env), and the security material the flags chose —
the keys and tokens of --auth, the certificates of --tls, the etcd and Redis users of
--secure (tools/secure_cluster.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from protocol.discovery import ENV_FILE, format_env, read_env_file

ROOT = "/quire"
MEMBER_BLANKED = ("QUIRE_AUTH_", "QUIRE_TLS_", "QUIRE_TOKEN", "QUIRE_ETCD_CA", "QUIRE_ETCD_CERT",
                  "QUIRE_ETCD_KEY")
"""Inherited variables members never get: their security is decided by `quire up`'s
flags alone (docs/cli.md)."""


class ClusterEnv:
    """LocalCluster's environment side: the cluster provides every attribute below, and
    `redis_url_for(role)`."""

    data_dir: Path
    store: str
    tls: Any
    secure: Any
    keys_file: str
    service_token: str
    admin_token: str
    endpoints: list[str]
    etcd_url: str
    redis_url: str

    def env(self) -> dict[str, str]:
        """What every member runs with: the cluster's addresses and the security its own
        flags chose. Inherited security variables are blanked (an empty QUIRE_* counts as
        unset), so a shell still holding another cluster's exports cannot give members
        settings the readiness probe and the other members do not share; members do not
        discover settings either (QUIRE_DISCOVER=0): they have exactly these."""
        return {**{k: "" for k in self.inherited_security()},
                "QUIRE_ETCD_URL": self.etcd_url, "QUIRE_ETCD_ROOT": ROOT,
                "QUIRE_REDIS_URL": self.redis_url, "QUIRE_STORE_URL": self.store,
                "QUIRE_DATA_DIR": str(self.data_dir), "PYTHONUNBUFFERED": "1",
                "QUIRE_DISCOVER": "0", **self.tls_env(), **self.auth_env(),
                **self.secure_env()}

    @staticmethod
    def inherited_security(environ: Mapping[str, str] | None = None) -> list[str]:
        """Variables of this process's environment that would change members' security
        (or point them at other credentials) and are therefore not passed on."""
        environ = os.environ if environ is None else environ
        return sorted(k for k, v in environ.items() if v and k.startswith(MEMBER_BLANKED))

    def client_env(self) -> dict[str, str]:
        """Everything a client needs, as QUIRE_* variables: printed by `quire up` as one
        block of `export` lines, kept in <data-dir>/env while it runs and printed by
        `quire env`. The one place that decides them (new security settings add theirs
        here)."""
        out = {"QUIRE_DATA_DIR": str(self.data_dir), "QUIRE_BROKER": ",".join(self.endpoints),
               "QUIRE_ETCD_URL": self.etcd_url, "QUIRE_ETCD_ROOT": ROOT,
               "QUIRE_REDIS_URL": self.redis_url, "QUIRE_STORE_URL": self.store}
        out.update({k: v for k, v in self.tls_env().items() if k != "QUIRE_TLS_CLIENT_AUTH"})
        if self.keys_file:  # the operator's token, and the keys to mint more with
            out.update({"QUIRE_TOKEN": self.admin_token, "QUIRE_AUTH_KEYS_FILE": self.keys_file})
        out.update(self.secure_exports())  # --secure: etcd's certificate, the operator's Redis user
        return out

    @property
    def env_path(self) -> Path:
        return self.data_dir / ENV_FILE

    def _write_env_file(self) -> None:
        text = format_env(self.client_env(), os.getpid(), self.data_dir)
        tmp = self.env_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold a token
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.env_path)

    def _remove_env_file(self) -> None:
        found = read_env_file(self.env_path)
        if found is not None and found.pid == os.getpid():
            self.env_path.unlink(missing_ok=True)

    def role_env(self, role: str) -> dict[str, str]:
        """env() with the Redis URL of `role` (worker, beat, coordinator)."""
        return {**self.env(), "QUIRE_REDIS_URL": self.redis_url_for(role)}

    def secure_exports(self) -> dict[str, str]:
        """With --secure: what the operator's CLI needs beyond QUIRE_BROKER, TLS and token:
        etcd (URL and the `quire` user's certificate) and Redis (the operator's ACL user,
        for `journals delete --purge` and `journals prune`)."""
        if self.secure is None:
            return {}
        return {"QUIRE_ETCD_URL": self.etcd_url, **self.secure_env(),
                "QUIRE_REDIS_URL": self.redis_url_for("beat")}

    def secure_env(self) -> dict[str, str]:
        """With --secure: every process's etcd client certificate (CN quire: the etcd user
        whose role reaches only the cluster's prefix)."""
        if self.secure is None:
            return {}
        q = self.secure.etcd_quire
        return {"QUIRE_ETCD_CA": q.ca, "QUIRE_ETCD_CERT": q.cert, "QUIRE_ETCD_KEY": q.key}

    def _make_auth(self) -> None:
        """--auth: a signing key kept under <data-dir>/auth/ (0600), a token for the
        cluster's own services (workers, dashboard: list, read, append on every journal)
        and an operator token (every capability) printed for the CLI; docs/security.md."""
        import base64

        from protocol.auth import Capability, Scope
        from protocol.credentials import load_keyring

        path = self.data_dir / "auth" / "keys"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(base64.b64encode(os.urandom(32)).decode() + "\n")
        self.keys_file = str(path)
        ring = load_keyring(None, self.keys_file)
        assert ring is not None
        every = Scope.of(["*"])
        self.service_token = ring.mint(Capability.LIST | Capability.READ | Capability.APPEND,
                                       every, 7 * 86400, "quire-up-services")
        self.admin_token = ring.mint(Capability(sum(Capability)), every, 86400, "quire-up-admin")

    def auth_env(self) -> dict[str, str]:
        """With --auth: every role gets the keys file (coordinators verify, the dashboard
        guards /api/state) and the services' token."""
        if not self.keys_file:
            return {}
        return {"QUIRE_AUTH_KEYS_FILE": self.keys_file, "QUIRE_TOKEN": self.service_token}

    def tls_env(self) -> dict[str, str]:
        """With --tls: coordinators serve mTLS with these; workers, the dashboard and the
        CLI verify them and present the same certificate (docs/security.md)."""
        if self.tls is None:
            return {}
        return {"QUIRE_TLS_CA": self.tls.ca, "QUIRE_TLS_CERT": self.tls.cert,
                "QUIRE_TLS_KEY": self.tls.key, "QUIRE_TLS_CLIENT_AUTH": "true"}
