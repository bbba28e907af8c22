"""etcd for tests and `quire up`: one member on loopback, or a cluster of several."""

from __future__ import annotations

import base64
import json
import shutil
import urllib.request
from typing import Any

from tools.services.process import Service, ServiceError, free_port

__all__ = ["EtcdCluster", "EtcdService", "prefix_range_end"]


def prefix_range_end(prefix: bytes) -> bytes:
    """The etcd `range_end` that selects every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


class EtcdService(Service):
    """`etcd` with its own data dir and client/peer ports on 127.0.0.1.

    The data dir lives in the workdir, so `restart()` (and start after
    `kill()`) come back with the same keys, revisions and leases, as after a
    real etcd crash.
    """

    ready_timeout = 30.0

    def __init__(
        self,
        name: str = "etcd",
        *,
        client_port: int | None = None,
        peer_port: int | None = None,
        binary: str = "etcd",
        listen_host: str = "127.0.0.1",
        initial_cluster: str | None = None,
        cluster_token: str | None = None,
        tls: Any = None,
        probe_cert: Any = None,
        extra_args: tuple[str, ...] | list[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.extra_args = tuple(extra_args)
        """More etcd flags, e.g. ("--max-txn-ops", "16", "--max-request-bytes", "65536")."""
        self.tls = tls
        """(ca, cert, key) files (tools.tls_certs.LocalCA): serve TLS on client and peer
        URLs and demand client certificates (`--client-cert-auth`), whose CN is the etcd
        user once auth is enabled (tools/secure_cluster.py)."""
        self.probe_cert = probe_cert
        """The (ca, cert, key) the readiness probe presents (a user allowed /health)."""
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.data_dir = self.workdir / "data"
        self.binary = binary
        self.listen_host = listen_host
        self.initial_cluster = initial_cluster
        """`name=http://host:peer,...` of every member; None: a cluster of this one."""
        self.cluster_token = cluster_token

    @property
    def host(self) -> str:
        return self.listen_host

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{self.listen_host}:{self.peer_port}"

    @property
    def port(self) -> int:
        return self.client_port

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.listen_host}:{self.client_port}"

    def describe(self) -> str:
        return self.url

    def build_argv(self) -> list[str]:
        exe = shutil.which(self.binary)
        if exe is None:
            raise ServiceError(
                f"{self.binary!r} not found on PATH; install the Debian package etcd-server"
            )
        peer = self.peer_url
        argv = [
            exe,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster or f"{self.name}={peer}",
            # A member cut off from the others keeps raising its term; without pre-vote
            # it forces the healthy quorum to elect again when it comes back, and every
            # lease refresh waits out that election (etcd 3.5 makes this the default).
            "--pre-vote",
        ]  # fmt: skip
        if self.cluster_token:
            argv += ["--initial-cluster-token", self.cluster_token]
        if self.tls is not None:
            argv += ["--cert-file", self.tls.cert, "--key-file", self.tls.key,
                     "--trusted-ca-file", self.tls.ca, "--client-cert-auth",
                     "--peer-cert-file", self.tls.cert, "--peer-key-file", self.tls.key,
                     "--peer-trusted-ca-file", self.tls.ca, "--peer-client-cert-auth"]
        return argv + list(self.extra_args)

    def build_env(self) -> dict[str, str]:
        env = super().build_env()
        # An ETCD_* variable in the caller's environment would silently
        # override flags (etcd reads both); keep only what we pass.
        for key in [k for k in env if k.startswith("ETCD_")]:
            del env[key]
        return env

    def probe(self) -> bool:
        ctx = None
        if self.tls is not None:
            from protocol.tls import client_context

            who = self.probe_cert or self.tls
            ctx = client_context(who.ca, who.cert, who.key)
        with urllib.request.urlopen(f"{self.url}/health", timeout=1.0, context=ctx) as resp:
            return json.loads(resp.read()).get("health") == "true"

    # -- synchronous keyspace helpers (grpc-gateway JSON API) ---------------
    # Fixtures use these so they need no event loop: async clients belong to
    # the test that creates them.

    def _gateway(self, path: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}/v3/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    @staticmethod
    def _b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    def count_prefix(self, prefix: bytes | str) -> int:
        """Number of keys under `prefix`."""
        p = prefix.encode() if isinstance(prefix, str) else prefix
        out = self._gateway(
            "kv/range",
            {"key": self._b64(p), "range_end": self._b64(prefix_range_end(p)), "count_only": True},
        )
        return int(out.get("count", 0))

    def delete_prefix(self, prefix: bytes | str) -> int:
        """Delete every key under `prefix`; return how many were deleted."""
        p = prefix.encode() if isinstance(prefix, str) else prefix
        out = self._gateway(
            "kv/deleterange",
            {"key": self._b64(p), "range_end": self._b64(prefix_range_end(p))},
        )
        return int(out.get("deleted", 0))

    def client_env(self) -> dict[str, str]:
        """Environment that points quire processes at this etcd."""
        return {"QUIRE_ETCD_URL": self.url}



class EtcdCluster:
    """Several etcd members forming one cluster (three by default), each an
    `EtcdService` with its own data dir; `url` lists every member's client URL, the
    form `QUIRE_ETCD_URL` takes. Members can be killed and started one by one: a
    member started again rejoins with its data, as after a crash."""

    def __init__(self, size: int = 3, *, name: str = "etcd", workdir: Any = None,
                 listen_hosts: list[str] | None = None, **kwargs: Any) -> None:
        import secrets
        from pathlib import Path

        hosts = listen_hosts or ["127.0.0.1"] * size
        if len(hosts) != size:
            raise ServiceError(f"etcd cluster of {size}: got {len(hosts)} hosts")
        names = [f"{name}-{i}" for i in range(size)]
        peers = [free_port() for _ in range(size)]
        initial = ",".join(f"{n}=http://{h}:{p}" for n, h, p in zip(names, hosts, peers, strict=True))
        token = f"quire-{secrets.token_hex(4)}"
        self.members = [
            EtcdService(n, peer_port=p, listen_host=h, initial_cluster=initial,
                        cluster_token=token,
                        workdir=None if workdir is None else Path(workdir) / n, **kwargs)
            for n, h, p in zip(names, hosts, peers, strict=True)
        ]

    @property
    def url(self) -> str:
        return ",".join(m.url for m in self.members)

    def client_env(self) -> dict[str, str]:
        return {"QUIRE_ETCD_URL": self.url}

    def start(self) -> "EtcdCluster":
        # Every member must be running before any is ready: the first one waits for
        # a quorum to elect a leader.
        for member in self.members:
            member.start(wait=False)
        try:
            for member in self.members:
                member.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for member in self.members:
            member.close()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
