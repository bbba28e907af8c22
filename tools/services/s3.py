"""An S3 endpoint on loopback (or a simulated host): moto's server, standing in for MinIO.

moto keeps everything in memory, so a restart loses every object; tests that
check durability must not restart it.
"""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from minio import Minio

from tools.services.process import Service, ServiceError, free_port

__all__ = ["S3Service", "empty_bucket"]


def _moto_server() -> str:
    # Prefer the interpreter's own bin dir: the venv is not necessarily on PATH.
    # Not resolved, because the venv's python is a symlink to the base install.
    local = Path(sys.executable).parent / "moto_server"
    if local.exists():
        return str(local)
    found = shutil.which("moto_server")
    if found is None:
        raise ServiceError("moto_server not found; install quire with its dev extras")
    return found


class S3Service(Service):
    ready_timeout = 30.0

    def __init__(
        self,
        name: str = "s3",
        *,
        port: int | None = None,
        access_key: str = "testing",
        secret_key: str = "testing-secret",
        region: str = "us-east-1",
        listen_host: str = "127.0.0.1",
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        self.listen_host = listen_host
        """The address it listens on: loopback, or a simulated host's (tools.hosts)."""
        self.port = port or free_port()
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region

    @property
    def endpoint(self) -> str:
        """host:port, the form the minio client takes."""
        return f"{self.listen_host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def describe(self) -> str:
        return self.url

    def build_argv(self) -> list[str]:
        return [_moto_server(), "-H", self.listen_host, "-p", str(self.port)]

    def build_env(self) -> dict[str, str]:
        env = super().build_env()
        env.update(
            AWS_ACCESS_KEY_ID=self.access_key,
            AWS_SECRET_ACCESS_KEY=self.secret_key,
            AWS_DEFAULT_REGION=self.region,
            PYTHONUNBUFFERED="1",
        )
        return env

    def probe(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/", timeout=1.0) as resp:
                return resp.status < 500
        except urllib.error.HTTPError as exc:
            # Any HTTP answer (even 403 to an unsigned request) means it serves.
            return exc.code < 500

    def client(self) -> Minio:
        return Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            secure=False,
        )

    def create_bucket(self, bucket: str) -> Minio:
        """Create `bucket` (it must not exist) and return a client for it."""
        client = self.client()
        client.make_bucket(bucket)
        return client

    def client_env(self) -> dict[str, str]:
        """Environment that points quire processes at this endpoint."""
        return {
            "QUIRE_S3_ENDPOINT": self.url,
            "QUIRE_S3_ACCESS_KEY": self.access_key,
            "QUIRE_S3_SECRET_KEY": self.secret_key,
            "QUIRE_S3_REGION": self.region,
            "QUIRE_S3_SECURE": "false",
        }


def empty_bucket(client: Minio, bucket: str, *, remove: bool = False) -> int:
    """Delete every object in `bucket` (and the bucket if `remove`)."""
    names = [o.object_name for o in client.list_objects(bucket, recursive=True)]
    for name in names:
        client.remove_object(bucket, name)
    if remove:
        client.remove_bucket(bucket)
    return len(names)
