"""minute-counts on Dask: the continuous job of spark/jobs/minute_counts.py as a Dask
streaming query (spark.dask_stream) on a `distributed` cluster.

Same input (JSON-lines journals whose messages carry `key` and an ISO-8601 `ts`), same
output: one JSON line per (minute, key) of each micro-batch, appended to the output
journal exactly once per batch,
`{"minute": "2026-01-01T00:03:00Z", "key": "user-07", "events": 4, "batch": 2}`.
Counts are per micro-batch: a minute's count is the sum of its lines.

    python -m spark.jobs.dask_minute_counts --selector topic=events --out-journal demo/minute-counts
        [--scheduler tcp://HOST:8786] [--brokers HOST:PORT,...] [--store URL]
        [--checkpoint DIR] [--max-bytes-per-trigger N] [--trigger-seconds S]
        [--until-idle] [-O s3.endpoint=http://HOST:9000 -O s3.accessKey=... ...]

Without `--scheduler` it starts a local `distributed` cluster in this process. Read
tasks run on the cluster's workers, which read persisted fragments from the store (with
the `-O` options, not the driver's environment) and unpersisted tails from the
coordinators (`--brokers`, as they advertise themselves). The checkpoint directory is
the driver's: started again on it, the query resumes after its last committed batch
and re-runs an uncommitted one without appending anything twice.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

NAME = "dask-minute-counts"
SCHEMA = {"journal": "string", "offset": "int64", "key": "string",
          "ts": "timestamp[us, tz=UTC]"}


def count_minutes(events: Any, batch_id: int) -> Any:
    """Per (minute, key) counts of a micro-batch, in one sorted partition (the same rows
    however the batch was split into parts: a re-run appends the same bytes)."""
    import pandas as pd

    def partial(pdf: pd.DataFrame) -> pd.DataFrame:
        pdf = pdf[pdf.ts.notna()]
        minute = pdf.ts.dt.floor("min").dt.strftime("%Y-%m-%dT%H:%M:%SZ")
        return (pdf.assign(minute=minute).groupby(["minute", "key"], dropna=False)
                .size().rename("events").reset_index())

    def total(pdf: pd.DataFrame) -> pd.DataFrame:
        out = (pdf.groupby(["minute", "key"], dropna=False).events.sum().reset_index()
               .sort_values(["minute", "key"], na_position="first", kind="stable"))
        return out.assign(events=out.events.astype("int64"), batch=batch_id) \
            .reset_index(drop=True)

    meta = pd.DataFrame({"minute": pd.Series(dtype=object), "key": pd.Series(dtype=object),
                         "events": pd.Series(dtype="int64")})
    partials = events.map_partitions(partial, meta=meta)
    return partials.repartition(npartitions=1).map_partitions(
        total, meta=meta.assign(batch=pd.Series(dtype="int64")))


def _client(scheduler: str) -> Any:
    import distributed

    if scheduler:
        return distributed.Client(scheduler, timeout=60, set_as_default=False)
    return distributed.Client(processes=False, n_workers=1, threads_per_worker=2,
                              dashboard_address=None, set_as_default=False)


def main(argv: Sequence[str] | None = None) -> int:
    from spark.dask_stream import BatchResult, DaskStreamQuery
    from spark.jobs.minute_counts import stream_params, stream_parser

    p = stream_parser(f"{NAME}: per-minute event counts per key, from journals into a "
                      "journal, on Dask")
    p.add_argument("--scheduler", default="", help="tcp://HOST:PORT (default: a local cluster)")
    p.add_argument("--trigger-seconds", type=float, default=1.0)
    ns = p.parse_args(argv)
    params = stream_params(p, ns, "quire-dask-minute-counts-")

    def report(r: BatchResult) -> None:
        again = " (re-run: planned by an earlier driver)" if r.rerun else ""
        print(f"{NAME}: micro-batch {r.batch_id}{again}: {r.bytes} bytes in {r.parts} "
              f"parts ({r.parts - r.tails} from the store, {r.tails} from the coordinators) "
              f"-> {r.rows_written} counts in {params.out_journal}", flush=True)

    with _client(ns.scheduler) as client:
        query = DaskStreamQuery(
            client, count_minutes, checkpoint=params.checkpoint, brokers=params.brokers,
            out_journal=params.out_journal, schema=SCHEMA, store=params.store,
            selector=params.selector or None, journals=params.journal or None,
            maxBytesPerTrigger=params.max_bytes_per_trigger or None,
            trigger_seconds=ns.trigger_seconds, **params.options)
        print(f"{NAME}: query {query.id}, checkpoint {params.checkpoint}", flush=True)
        try:
            if ns.until_idle:
                for result in query.process_all_available():
                    report(result)
            else:
                query.run(report)
        except KeyboardInterrupt:
            pass
        finally:
            query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
