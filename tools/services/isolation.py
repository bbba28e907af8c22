"""Per-test slices of shared services.

Starting etcd, Redis and S3 once per session is what keeps integration tests
fast; these helpers give each test its own etcd prefix, Redis database and
bucket, check the slice is empty when handed out (a leak from an earlier test
fails the test that would be confused by it, not some later one) and wipe it
afterwards.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis
from minio import Minio

from tools.services.etcd import EtcdService
from tools.services.process import ServiceError
from tools.services.redis_server import RedisService
from tools.services.s3 import S3Service, empty_bucket

__all__ = ["Bucket", "RedisDb", "RedisDbPool", "etcd_prefix", "fresh_bucket", "slug"]


def slug(text: str, *, max_len: int = 40) -> str:
    """`text` (a test id) squeezed into [a-z0-9-] plus a random suffix."""
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:max_len].strip("-")
    return f"{base or 't'}-{uuid.uuid4().hex[:8]}"


@contextmanager
def etcd_prefix(etcd: EtcdService, name: str, *, parent: str = "/quire-test") -> Iterator[str]:
    """A unique, empty key prefix such as `/quire-test/test-put-1a2b3c4d`,
    usable as a quire `etcd_root`; everything under it is deleted on exit."""
    root = f"{parent}/{slug(name)}"
    if etcd.count_prefix(root) != 0:
        raise ServiceError(f"etcd prefix {root} is not empty at the start of {name}")
    try:
        yield root
    finally:
        etcd.delete_prefix(root)
        left = etcd.count_prefix(root)
        if left:
            raise ServiceError(f"etcd prefix {root} still holds {left} keys after cleanup")


@dataclass(frozen=True)
class RedisDb:
    db: int
    url: str
    prefix: str
    client: redis.Redis


class RedisDbPool:
    """Hands out whole Redis databases (1..databases-1; 0 stays free for ad-hoc
    use). A whole database, not just a key prefix, because Celery and kombu
    own key names we do not choose."""

    def __init__(self, server: RedisService) -> None:
        self.server = server
        self._free = list(range(server.databases - 1, 0, -1))
        self._lock = threading.Lock()

    @contextmanager
    def lease(self, name: str) -> Iterator[RedisDb]:
        with self._lock:
            if not self._free:
                raise ServiceError(f"all {self.server.databases - 1} Redis databases are in use")
            db = self._free.pop()
        client = self.server.client(db)
        try:
            if client.dbsize() != 0:
                raise ServiceError(f"Redis db {db} is not empty at the start of {name}")
            yield RedisDb(db=db, url=self.server.url_for(db), prefix=slug(name) + ":", client=client)
        finally:
            try:
                client.flushdb()
            finally:
                client.close()
                with self._lock:
                    self._free.append(db)


@dataclass(frozen=True)
class Bucket:
    name: str
    client: Minio
    endpoint: str  # host:port
    url: str  # http://host:port


@contextmanager
def fresh_bucket(s3: S3Service, name: str) -> Iterator[Bucket]:
    """A new, empty bucket; it and its objects are removed on exit."""
    bucket = slug(name, max_len=40)
    client = s3.create_bucket(bucket)
    try:
        yield Bucket(name=bucket, client=client, endpoint=s3.endpoint, url=s3.url)
    finally:
        empty_bucket(client, bucket, remove=True)
