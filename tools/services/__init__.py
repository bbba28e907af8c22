"""Start and stop the real services quire depends on (etcd, redis-server, an
S3 endpoint, Celery workers) on loopback, for tests and `quire up`."""

from tools.services.celery_worker import CeleryWorkerService, celery_client
from tools.services.etcd import EtcdService, prefix_range_end
from tools.services.isolation import Bucket, RedisDb, RedisDbPool, etcd_prefix, fresh_bucket, slug
from tools.services.process import (
    Service,
    ServiceError,
    free_port,
    kill_all,
    live_services,
    pid_alive,
    wait_for,
)
from tools.services.quire_up import QuireUpService
from tools.services.redis_server import RedisService
from tools.services.s3 import S3Service, empty_bucket

__all__ = [
    "Bucket",
    "RedisDb",
    "RedisDbPool",
    "etcd_prefix",
    "fresh_bucket",
    "slug",
    "CeleryWorkerService",
    "EtcdService",
    "RedisService",
    "S3Service",
    "QuireUpService",
    "Service",
    "ServiceError",
    "celery_client",
    "empty_bucket",
    "free_port",
    "kill_all",
    "live_services",
    "pid_alive",
    "prefix_range_end",
    "wait_for",
]
