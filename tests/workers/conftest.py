"""Fixtures of the workers role tests: real worker processes, etcd topology, stores.

Every worker runs as `celery -A workers.app worker` in its own process group,
pointed at this test's Redis database, etcd prefix and bucket.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.services import CeleryWorkerService, EtcdService, RedisDb, S3Service, celery_client

from .workers_support import worker_env


@pytest.fixture
def env(redis_db: RedisDb, etcd: EtcdService, etcd_root: str, s3: S3Service) -> dict[str, str]:
    return worker_env(redis_db.url, etcd, etcd_root, s3)


@pytest.fixture
def start_worker(redis_db: RedisDb, env: dict[str, str]) -> Iterator[Callable[..., CeleryWorkerService]]:
    """start_worker(queues=..., extra_env=...) -> a running worker; all stopped at the end."""
    started: list[CeleryWorkerService] = []

    def start(queues: tuple[str, ...] = ("persist", "index", "pulse", "celery"),
              redis_url: str | None = None, concurrency: int = 2,
              **extra_env: str) -> CeleryWorkerService:
        merged = {**env, **extra_env}
        if redis_url:
            merged["QUIRE_REDIS_URL"] = redis_url
        svc = CeleryWorkerService(
            f"w{uuid.uuid4().hex[:6]}", redis_url=redis_url or redis_db.url, queues=queues,
            pool="threads", concurrency=concurrency, env=merged)
        started.append(svc)
        return svc.start()

    yield start
    for svc in started:
        svc.close()


@pytest.fixture
def client(redis_db: RedisDb) -> Iterator[Any]:
    app = celery_client(redis_db.url)
    yield app
    app.close()


@pytest.fixture
def file_store(tmp_path: Path) -> str:
    root = tmp_path / "store"
    root.mkdir()
    return root.as_uri() + "/"


