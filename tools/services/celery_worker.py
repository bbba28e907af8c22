"""A Celery worker subprocess (`celery -A workers.app worker`)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from typing import Any, Literal

from celery import Celery

from tools.services.process import Service, ServiceError

__all__ = ["CeleryWorkerService", "celery_client"]


def celery_client(redis_url: str) -> Celery:
    """A bare Celery app that sends tasks by name and talks to workers.

    Deliberately not `workers.app`: callers outside the workers role (tests,
    the demo, the coordinator) must not import it, and by-name sends keep them
    honest about that boundary.
    """
    from protocol.redis_security import celery_redis_conf

    app = Celery("quire-client", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(
        **celery_redis_conf(redis_url),
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
    )
    return app


class CeleryWorkerService(Service):
    """A worker consuming `queues` with a given pool, ready once it answers a
    control ping addressed to its own node name."""

    ready_timeout = 60.0
    stop_timeout = 20.0

    def __init__(
        self,
        name: str = "worker",
        *,
        redis_url: str,
        queues: Sequence[str] = ("celery",),
        pool: Literal["threads", "prefork", "solo"] = "threads",
        concurrency: int = 2,
        app: str = "workers.app",
        loglevel: str = "INFO",
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        merged_env = {"QUIRE_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        merged_env.update(env or {})
        super().__init__(name, env=merged_env, **kwargs)
        self.redis_url = redis_url
        self.queues = list(queues)
        self.pool = pool
        self.concurrency = concurrency
        self.app = app
        self.loglevel = loglevel
        self.extra_args = list(extra_args)
        self.nodename = f"{name}@{socket.gethostname()}"
        self._control: Celery | None = None

    def describe(self) -> str:
        return f"{self.nodename} queues={','.join(self.queues)} pool={self.pool}x{self.concurrency}"

    def build_argv(self) -> list[str]:
        if not self.queues:
            raise ServiceError(f"{self.name}: a worker needs at least one queue")
        return [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-Q", ",".join(self.queues),
            "--pool", self.pool,
            "--concurrency", str(self.concurrency),
            "-n", self.nodename,
            "-E",
            "--loglevel", self.loglevel,
            *self.extra_args,
        ]  # fmt: skip

    def probe(self) -> bool:
        if self._control is None:
            self._control = celery_client(self.redis_url)
        replies = self._control.control.ping(destination=[self.nodename], timeout=0.5)
        return any(self.nodename in reply for reply in replies or ())

    def stop(self, timeout: float | None = None) -> int | None:
        try:
            return super().stop(timeout)
        finally:
            self._close_control()

    def kill(self) -> int | None:
        try:
            return super().kill()
        finally:
            self._close_control()

    def _close_control(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
