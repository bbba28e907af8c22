"""A throwaway redis-server on loopback (Celery broker/backend, index cache)."""

from __future__ import annotations

import shutil
from typing import Any

import redis

from tools.services.process import Service, ServiceError, free_port

__all__ = ["RedisService"]


class RedisService(Service):
    """`redis-server` on loopback. Redis is a cache and a queue, never the source of
    truth (etcd and the store are), so tests run it without persistence; `quire up`
    asks for `appendonly` (AOF in the workdir, fsync every second) so that a Redis it
    restarts after a crash comes back with the Celery tasks still queued."""

    ready_timeout = 15.0

    def __init__(
        self,
        name: str = "redis",
        *,
        port: int | None = None,
        databases: int = 16,
        binary: str = "redis-server",
        appendonly: bool = False,
        tls: Any = None,
        aclfile: str | None = None,
        probe_user: tuple[str, str] | None = None,
        listen_host: str = "127.0.0.1",
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.listen_host = listen_host
        """The address it binds and clients use (a host's, inside tools.hosts)."""
        self.tls = tls
        """(ca, cert, key) files: serve TLS only (`--port 0 --tls-port`), clients verify
        the server by the CA (tools/secure_cluster.py)."""
        self.aclfile = aclfile
        """An ACL file (users and their rights; `default` off): no anonymous access."""
        self.probe_user = probe_user
        """(user, password) the readiness probe authenticates as."""
        self.port = port or free_port()
        self.appendonly = appendonly
        self.databases = databases
        self.binary = binary

    @property
    def host(self) -> str:
        return self.listen_host

    def url_for(self, db: int = 0) -> str:
        if self.tls is not None:
            return f"rediss://{self.listen_host}:{self.port}/{db}?ssl_ca_certs={self.tls.ca}"
        return f"redis://{self.listen_host}:{self.port}/{db}"

    @property
    def url(self) -> str:
        return self.url_for(0)

    def describe(self) -> str:
        return self.url

    def build_argv(self) -> list[str]:
        exe = shutil.which(self.binary)
        if exe is None:
            raise ServiceError(
                f"{self.binary!r} not found on PATH; install the Debian package redis-server"
            )
        secure: list[str] = []
        if self.tls is not None:
            secure += ["--port", "0", "--tls-port", str(self.port),
                       "--tls-cert-file", self.tls.cert, "--tls-key-file", self.tls.key,
                       "--tls-ca-cert-file", self.tls.ca, "--tls-auth-clients", "no"]
        else:
            secure += ["--port", str(self.port)]
        if self.aclfile is not None:
            secure += ["--aclfile", self.aclfile]
        return [
            exe,
            *secure,
            "--bind", self.listen_host,
            # Off the loopback (a host of tools.hosts) Redis 7 refuses password-less
            # clients unless told its bind address is meant to be reached.
            "--protected-mode", "yes" if self.listen_host.startswith("127.") else "no",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--dir", str(self.workdir),
            "--databases", str(self.databases),
            # Foreground, logging to stdout (our log file).
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        if self.tls is not None:
            kwargs = {"ssl": True, "ssl_ca_certs": self.tls.ca, **kwargs}
        if self.probe_user is not None:
            kwargs = {"username": self.probe_user[0], "password": self.probe_user[1], **kwargs}
        return redis.Redis(host=self.listen_host, port=self.port, db=db, **kwargs)

    def probe(self) -> bool:
        with self.client(socket_timeout=1.0, socket_connect_timeout=1.0) as r:
            return bool(r.ping())

    def client_env(self, db: int = 0) -> dict[str, str]:
        return {"QUIRE_REDIS_URL": self.url_for(db)}
