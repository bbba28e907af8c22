"""The Celery app of the workers role.

`celery -A workers.app worker -Q <queues>` loads `app` from here. The broker
and result backend are both the Redis at `QUIRE_REDIS_URL`. Task modules are
listed in `TASK_MODULES`; callers outside this role send tasks by name and
never import this package.

Queues: `persist` (fragment uploads, long), `index` (store listings), `pulse`
(zero-byte appends), `prune` (retention deletes), and `celery` (health pings). Beat runs a fixed handful of
sweeps whatever the number of journals; each sweep fans out per-journal tasks.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import setup_logging, worker_ready, worker_shutdown

from protocol.config import Settings, load_settings
from protocol.credentials import settings_keyring
from protocol.logs import configure_logging, get_logger
from protocol.redis_security import celery_redis_conf, sign_published_tasks
from workers import signing
from workers.config import WorkerSettings, load_worker_settings
from workers.jobs_schedule import JOB_ROUTES, JOB_TASK_MODULES, job_beat

TASK_MODULES = ["workers.health", "workers.persist", "workers.index", "workers.pulse",
                "workers.prune", "workers.scrub", *JOB_TASK_MODULES]

QUEUES = ("persist", "index", "pulse", "prune", "jobs")

log = get_logger(__name__)


def make_app(settings: Settings | None = None, worker: WorkerSettings | None = None) -> Celery:
    settings = load_settings() if settings is None else settings
    worker = load_worker_settings() if worker is None else worker
    # With auth on (keys configured), every message is signed on the way out and checked
    # before it runs (workers/signing.py, docs/security.md).
    keyring = settings_keyring(settings)
    signing.configure(keyring)
    sign_published_tasks(keyring.task_keys() if keyring is not None else None)
    app = Celery("quire", broker=settings.redis_url, backend=settings.redis_url,
                 include=TASK_MODULES, task_cls=signing.SignedTask)
    io = worker.io_timeout
    redis_opts = {
        "visibility_timeout": worker.visibility_timeout,
        # How soon a message abandoned by a dead worker is restored: a sweep every
        # few seconds (one cheap ZRANGE), not kombu's default of ~100 s.
        "unacked_restore_interval": max(1.0, min(10.0, worker.visibility_timeout / 5)),
        "unacked_restore_throttle": 1,
        "socket_timeout": io,
        "socket_connect_timeout": min(io, 5.0),
        "health_check_interval": 10,
    }
    app.conf.update(
        # Flower and the dashboard need both: worker events for pools and
        # task states, sent events to see tasks queued but not yet started.
        worker_send_task_events=True,
        task_send_sent_event=True,
        # Our structlog handler (see below) stays the only root handler.
        worker_hijack_root_logger=False,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=redis_opts,
        redis_socket_timeout=io,
        redis_socket_connect_timeout=min(io, 5.0),
        result_expires=3600,
        **celery_redis_conf(settings.redis_url),
        task_routes={
            "workers.persist.*": {"queue": "persist"},
            "workers.index.*": {"queue": "index"},
            "workers.pulse.*": {"queue": "pulse"},
            "workers.prune.*": {"queue": "prune"},
            "workers.scrub.*": {"queue": "prune"},  # maintenance, beside retention
            **JOB_ROUTES,
        },
        task_default_queue="celery",
        # Every task here is idempotent (it re-checks the world when it runs),
        # so a crash mid-task must redeliver it rather than lose it.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Persist tasks are long: one at a time per pool slot, so a slow upload
        # never holds a second message hostage.
        worker_prefetch_multiplier=1,
        task_soft_time_limit=worker.persist_time_limit * 0.9,
        task_time_limit=worker.persist_time_limit,
        # Run exactly one beat. Its schedule is fixed-size: sweeps fan out.
        beat_schedule={
            "index-sweep": {
                "task": "workers.index.sweep",
                "schedule": worker.index_sweep_interval,
                "options": {"queue": "index", "expires": worker.index_sweep_interval},
            },
            "prune-sweep": {
                "task": "workers.prune.sweep",
                "schedule": worker.prune_interval,
                "options": {"queue": "prune", "expires": worker.prune_interval},
            },
            "scrub-sweep": {
                "task": "workers.scrub.sweep",
                "schedule": worker.scrub_interval,
                "options": {"queue": "prune", "expires": worker.scrub_interval},
            },
            "pulse-sweep": {
                "task": "workers.pulse.sweep",
                "schedule": worker.pulse_interval,
                "options": {"queue": "pulse", "expires": worker.pulse_interval},
            },
            **job_beat(worker),
        },
    )
    app.conf.quire_settings = settings
    app.conf.quire_worker = worker
    return app


settings = load_settings()
worker_settings = load_worker_settings()
app = make_app(settings, worker_settings)


@setup_logging.connect
def _setup_logging(loglevel: Any = None, **_: Any) -> None:
    # Connecting to this signal stops Celery from configuring logging itself;
    # `--loglevel` still wins over QUIRE_LOG_LEVEL.
    configure_logging(settings.log_format, loglevel or settings.log_level, count_errors=True)


@worker_ready.connect
def _serve_metrics(**_: Any) -> None:
    if worker_settings.metrics_port:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = None
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # prefork pool: task metrics live in the children; aggregate them.
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        start_http_server(worker_settings.metrics_port, addr=worker_settings.metrics_addr,
                          **({"registry": registry} if registry is not None else {}))
        log.info("metrics server started", port=worker_settings.metrics_port)


_announcer: list[Any] = []


@worker_ready.connect
def _announce_stores(sender: Any = None, **_: Any) -> None:
    """Publish the stores this worker writes to (workers/announce.py)."""
    from workers.announce import Announcer, announcement

    node = str(getattr(sender, "hostname", "") or f"worker-{os.getpid()}")
    value = announcement(node, settings.store_url, worker_settings.stores, signing.enabled())
    a = Announcer(settings.etcd_url, settings.etcd_root, value,
                  io_timeout=min(worker_settings.io_timeout, 10.0))
    a.start()
    _announcer.append(a)


@worker_shutdown.connect
def _withdraw_stores(**_: Any) -> None:
    while _announcer:
        _announcer.pop().stop()
