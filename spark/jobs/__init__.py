"""Batch pipelines over journals, run by `quire spark run JOB` or `spark-submit`.

A job module exposes `NAME`, `DESCRIPTION`, `run(spark, params) -> DataFrame` (it writes
its output and returns what it wrote) and `main(argv)` for spark-submit.

`minute_counts` is a continuous (Structured Streaming) job, run by
`python -m spark.jobs.minute_counts`; it is not a batch job and is not in JOBS.
`dask_minute_counts` is the same continuous job on Dask (spark.dask_stream), run by
`python -m spark.jobs.dask_minute_counts --scheduler tcp://HOST:PORT`; not in JOBS either.
`window_counts` is a target of quire's own job scheduler (docs/jobs.md), run by the
workers as `python -m spark.jobs.window_counts --run JSON`; it is not in JOBS either.
`dask_targets` holds Dask functions that are `kind: dask` job targets (`window_counts`),
run by the workers through `python -m spark.jobs.dask_run --target NAME --run JSON`.
"""

from __future__ import annotations

from types import ModuleType

from . import hourly_counts

JOBS: dict[str, ModuleType] = {hourly_counts.NAME: hourly_counts}


def get_job(name: str) -> ModuleType:
    from protocol import ValidationError

    try:
        return JOBS[name]
    except KeyError:
        raise ValidationError("job", f"unknown job {name!r} (known: {', '.join(sorted(JOBS))})") from None
