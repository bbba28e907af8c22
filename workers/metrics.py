"""Prometheus metrics of the worker processes (`quire_` prefix, base units).

Served by the worker's main process when `QUIRE_WORKER_METRICS_PORT` is set
(see workers.app). Labels are task names and outcomes only: journal names are
unbounded, so per-journal lag is measured where it is bounded by what a process
hosts — in the coordinator's persister (`quire_persist_lag_*`).
"""

from __future__ import annotations

from typing import Any

from celery.signals import task_failure, task_retry, task_success
from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "INDEX_REFRESH_SECONDS",
    "PERSIST_BYTES",
    "PERSIST_FAILURES",
    "PERSIST_LAST_FAILURE",
    "PERSIST_OBJECTS",
    "REFUSED_TASKS",
    "TASK_FAILURES",
    "TASK_OUTCOMES",
]

TASK_OUTCOMES = Counter(
    "quire_worker_tasks_total",
    "Tasks finished by this worker, by task name and outcome (success, failure, retry).",
    ["task", "outcome"],
)
TASK_FAILURES = Counter(
    "quire_worker_task_failures_total",
    "Tasks that failed for good (retries exhausted or a non-retriable error).",
    ["task"],
)
REFUSED_TASKS = Counter(
    "quire_worker_refused_tasks_total",
    "Task messages refused before running (workers.signing), by task name and reason: "
    "unsigned, bad_signature, no_apply_token.",
    ["task", "reason"],
)
PERSIST_BYTES = Counter(
    "quire_persist_bytes_total",
    "Raw (uncompressed) fragment bytes uploaded to stores by persist tasks.",
)
PERSIST_OBJECTS = Counter(
    "quire_persist_fragments_total",
    "Persist tasks finished, by result: uploaded, exists (already in the store), "
    "or covered (the store holds its span in other fragments).",
    ["result"],
)
PERSIST_FAILURES = Counter(
    "quire_persist_failures_total",
    "Persist attempts that failed or were refused, by journal and reason: store_not_allowed "
    "(the store is not this worker's QUIRE_STORE_URL / QUIRE_WORKER_STORES), "
    "store_unavailable, fetch_failed (no replica served the fragment), checksum, timeout, "
    "invalid, other (workers/persist_failures.py).",
    ["journal", "reason"],
)
PERSIST_LAST_FAILURE = Gauge(
    "quire_persist_last_failure_timestamp_seconds",
    "Unix time of the last failed or refused persist attempt, by journal and reason.",
    ["journal", "reason"], multiprocess_mode="max",
)
INDEX_REFRESH_SECONDS = Histogram(
    "quire_index_refresh_duration_seconds",
    "Time to list a journal's stores and publish its fragment index.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

JOURNAL_FRAGMENTS = Gauge(
    "quire_journal_fragments", "Fragments of a journal in its stores (index refresh).",
    ["journal"], multiprocess_mode="max")
JOURNAL_STORED_BYTES = Gauge(
    "quire_journal_stored_bytes", "Bytes a journal occupies in its stores, after compression.",
    ["journal"], multiprocess_mode="max")
JOURNAL_OLDEST_FRAGMENT = Gauge(
    "quire_journal_oldest_fragment_timestamp_seconds",
    "Mod time of a journal's oldest stored fragment (0 if none).",
    ["journal"], multiprocess_mode="max")
STORAGE_GAUGES = (JOURNAL_FRAGMENTS, JOURNAL_STORED_BYTES, JOURNAL_OLDEST_FRAGMENT)


def _name(sender: Any) -> str:
    return str(getattr(sender, "name", sender) or "unknown")


@task_success.connect
def _on_success(sender: Any = None, **_: Any) -> None:
    TASK_OUTCOMES.labels(_name(sender), "success").inc()


@task_retry.connect
def _on_retry(sender: Any = None, **_: Any) -> None:
    TASK_OUTCOMES.labels(_name(sender), "retry").inc()


@task_failure.connect
def _on_failure(sender: Any = None, **_: Any) -> None:
    TASK_OUTCOMES.labels(_name(sender), "failure").inc()
    TASK_FAILURES.labels(_name(sender)).inc()
