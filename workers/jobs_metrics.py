"""Prometheus metrics of jobs and the persisted watermark (`quire_` prefix, base units).

Served with the other worker metrics (workers.metrics) by the worker's main process.
Job names are operator-defined and few, so they are labels; journals label the
watermark gauge as they label the storage gauges of the index refresh.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["JOB_RUNS", "JOB_RUN_SECONDS", "JOB_WATERMARK_LAG", "JOURNAL_WATERMARK"]

JOURNAL_WATERMARK = Gauge(
    "quire_journal_persisted_watermark_seconds",
    "Unix time up to which everything the journal acknowledged is in the fragment store.",
    ["journal"], multiprocess_mode="max")
JOB_RUNS = Counter(
    "quire_job_runs_total",
    "Run state changes by job and the state entered (pending, running, succeeded, failed, "
    "gave_up).",
    ["job", "state"])
JOB_RUN_SECONDS = Histogram(
    "quire_job_run_duration_seconds",
    "Wall time of one attempt of a job's run, by job and outcome.",
    ["job", "outcome"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600))
JOB_WATERMARK_LAG = Gauge(
    "quire_job_watermark_lag_seconds",
    "Now minus the lowest persisted watermark of a job's journals (scheduler sweep).",
    ["job"], multiprocess_mode="max")
JOB_START_DELAY = Histogram(
    "quire_job_start_delay_seconds",
    "From a window's end to its run's first start, by job (includes the spec's delay).",
    ["job"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600))
