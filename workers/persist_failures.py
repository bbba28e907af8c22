"""Why a journal's fragments do not persist, where an operator looks (not only the log).

Every failed or refused persist attempt is classified (`reason`), counted in
`quire_persist_failures_total{journal,reason}`, stamped in
`quire_persist_last_failure_timestamp_seconds{journal,reason}` and recorded in the Redis
hash `quire:persist-failures` (fragment_store/persist_status.py), which
`quire journals list --stats`, the dashboard and `quire doctor` show. A successful persist
of the journal deletes its entry. Recording never masks the task's own error.
"""

from __future__ import annotations

import time

import msgspec
from celery.exceptions import SoftTimeLimitExceeded

from fragment_store import ChecksumMismatch, StoreUnavailable
from fragment_store.persist_status import FAILURES_KEY, PersistFailure, decode_failure
from protocol import ValidationError
from protocol.logs import get_logger
from workers import common, metrics
from workers.errors import ContentMismatch, ReplicaUnavailable

__all__ = ["classify", "record_failure", "record_success"]

log = get_logger(__name__)

MESSAGE_LIMIT = 300


def classify(exc: BaseException) -> str:
    """store_not_allowed, store_unavailable, fetch_failed, checksum, timeout, invalid, other."""
    if type(exc).__name__ == "StoreNotAllowed":  # workers.persist (which imports us)
        return "store_not_allowed"
    if isinstance(exc, StoreUnavailable):
        return "store_unavailable"
    if isinstance(exc, ReplicaUnavailable):
        return "fetch_failed"
    if isinstance(exc, (ChecksumMismatch, ContentMismatch)):
        return "checksum"
    if isinstance(exc, (SoftTimeLimitExceeded, TimeoutError)):
        return "timeout"
    if isinstance(exc, ValidationError):
        return "invalid"
    return "other"


def record_failure(journal: str, store: str, exc: BaseException, worker: str = "") -> str:
    """Count and record one failed attempt; returns its reason."""
    reason = classify(exc)
    now = time.time()
    metrics.PERSIST_FAILURES.labels(journal, reason).inc()
    metrics.PERSIST_LAST_FAILURE.labels(journal, reason).set(now)
    message = " ".join(f"{type(exc).__name__}: {exc}".split())[:MESSAGE_LIMIT]
    try:
        r = common.redis_client()
        prev_raw = r.hget(FAILURES_KEY, journal)
        prev = None
        if prev_raw:
            try:
                prev = decode_failure(prev_raw)
            except ValueError:
                prev = None
        entry = PersistFailure(reason=reason, message=message, store=store,
                               count=(prev.count + 1) if prev else 1,
                               first=prev.first if prev else now, last=now, worker=worker)
        r.hset(FAILURES_KEY, journal, msgspec.json.encode(entry))
    except Exception as err:  # noqa: BLE001 - the task's own error is what matters
        log.warning("cannot record the persist failure in Redis", journal=journal,
                    error=f"{type(err).__name__}: {err}")
    return reason


def record_success(journal: str) -> None:
    """The journal persists again: its failure entry goes."""
    try:
        common.redis_client().hdel(FAILURES_KEY, journal)
    except Exception as err:  # noqa: BLE001
        log.warning("cannot clear the persist failure in Redis", journal=journal,
                    error=f"{type(err).__name__}: {err}")
