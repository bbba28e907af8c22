"""Errors of the workers role.

    QuireError (protocol.errors)
    └── WorkerError                 base; `retriable` says whether autoretry applies
        ├── TopologyUnavailable     etcd could not be read in time            (retriable)
        ├── ReplicaUnavailable      no replica endpoint served the fragment   (retriable)
        │   └── FragmentNotLocal    every replica answered, none holds it      (retriable)
        ├── ContentMismatch         fetched bytes do not match the fragment's SHA-1 (retriable)
        ├── JournalUnknown          the journal has no spec (deleted)          (not retriable)
        └── PulseFailed             a zero-byte append did not commit           (retriable)

Celery tasks autoretry on `RETRIABLE` with exponential backoff and jitter; anything
else fails the task at once (and counts in `quire_worker_task_failures_total`).
"""

from __future__ import annotations

from protocol.errors import QuireError

__all__ = [
    "ContentMismatch",
    "FragmentNotLocal",
    "JournalUnknown",
    "PulseFailed",
    "RETRIABLE",
    "ReplicaUnavailable",
    "TopologyUnavailable",
    "WorkerError",
]


class WorkerError(QuireError):
    """Base of errors raised by worker tasks."""

    retriable = True


class TopologyUnavailable(WorkerError):
    """etcd did not answer (or answered garbage) within the IO timeout."""


class ReplicaUnavailable(WorkerError):
    """No endpoint could stream the fragment (connection refused, timeout, reset)."""


class FragmentNotLocal(ReplicaUnavailable):
    """Every reachable replica answered that it does not hold the fragment."""


class ContentMismatch(WorkerError):
    """The fetched content's length or SHA-1 differs from the fragment's."""


class JournalUnknown(WorkerError):
    """The journal has no spec in etcd: it was deleted; there is nothing to do."""

    retriable = False


class PulseFailed(WorkerError):
    """A pulse (zero-byte append) was answered with a non-OK status or not at all."""


RETRIABLE: tuple[type[BaseException], ...] = (
    TopologyUnavailable, ReplicaUnavailable, ContentMismatch, PulseFailed, OSError, TimeoutError,
)


MAINTENANCE_RETRY: dict[str, object] = {
    "autoretry_for": RETRIABLE, "retry_backoff": True, "retry_backoff_max": 30,
    "retry_jitter": True, "max_retries": 2,
}
"""Retry policy of the short maintenance tasks (sweeps, pulses): a few quick retries with
jittered backoff, since the next beat tick re-runs them anyway."""
