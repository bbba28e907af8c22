"""Dask functions for quire's job scheduler (docs/jobs.md, "Targets"): `kind: dask` targets.

    target: {kind: dask, name: spark.jobs.dask_targets:window_counts}

The workers run a Dask target as `python -m spark.jobs.dask_run --target NAME --run JSON`;
the runner calls the function with the run context as keyword arguments (`job`,
`window_start`, `window_end`, `ranges`, `stores`, `fallback_stores`, `brokers`, `output`,
`args`, `rerun`,
`attempt`, `idempotency_key`, ...) and records what it returns as the run's result.

`window_counts` is the counterpart of the Celery target `workers.jobs_targets.window_counts`
and the Spark target `spark.jobs.window_counts`: the Dask reader reads each journal's
offset range of the window straight from the store (proving every fragment; a copy rotten
in the first store is read from the journal's other stores, `fallback_stores`), the counts per journal (and per
`args.field` of JSON messages) are computed by Dask, and the Dask writer appends them to
the output journal in one partition under the run's `idempotency_key`. Every attempt of a
run has the same key and computes the same rows in the same partition, so a retried
attempt — its first one wrote, then died or failed — is answered with the first one's
commit: the window's rows are in the output once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["window_counts"]


def _ensure_output(brokers: list[str], output: str, store: str) -> None:
    """Create the output journal if it is missing (as the Celery target does)."""
    from protocol import FragmentSpec, JournalSpec
    from quire.client import QuireError, SyncClient

    with SyncClient(brokers, retry_timeout=60) as client:
        try:
            client.get_journal(output)
            return
        except QuireError:
            pass
        client.apply([JournalSpec(name=output, replication=1,
                                  fragment=FragmentSpec(stores=(store,) if store else ()))])
        client.append(output, b"")  # waits (retry_timeout) until the journal is assigned


def counts(ctx: dict[str, Any]) -> Any:
    """The window's counts as a pandas DataFrame, sorted: `journal`[, field], `messages`,
    `job`, `window_start`, `window_end`, `rerun`. Empty (no rows) for an empty window."""
    import dask.dataframe as dd
    import pandas as pd

    from spark.dask_reader import read_journals

    field = str((ctx.get("args") or {}).get("field", ""))
    keys = ["journal", *([field] if field else [])]
    stores = ctx.get("stores") or {}
    fallbacks = ctx.get("fallback_stores") or {}
    frames = []
    for journal, (begin, end) in sorted(ctx["ranges"].items()):
        if int(end) <= int(begin):
            continue
        if journal not in stores:
            raise ValueError(f"journal {journal!r} has no fragment store: a Dask target reads "
                             "the window from the store")
        schema = {"journal": "", "offset": "", **({field: "string"} if field else {})}
        frames.append(read_journals(stores[journal], journal=journal, begin=int(begin),
                                    end=int(end), framing="jsonl", schema=schema,
                                    fallbackStores=",".join(fallbacks.get(journal) or ())))
    if frames:
        ddf = dd.concat(frames) if len(frames) > 1 else frames[0]
        if field:
            ddf = ddf.assign(**{field: ddf[field].fillna("")})
        sizes = ddf.groupby(keys).size().compute()
        out = sizes.rename("messages").reset_index()
    else:
        out = pd.DataFrame({k: pd.Series(dtype="string") for k in keys})
        out["messages"] = pd.Series(dtype="int64")
    out = out.astype({k: "string" for k in keys}).astype({"messages": "int64"})
    out = out.sort_values(keys, kind="stable").reset_index(drop=True)
    out["job"] = ctx["job"]
    out["window_start"] = int(ctx["window_start"])
    out["window_end"] = int(ctx["window_end"])
    out["rerun"] = int(ctx.get("rerun", 0))
    return out


def window_counts(**ctx: Any) -> dict[str, Any]:
    """Count one window's messages per journal (and `args.field`) with Dask and append the
    counts, one JSON line per row, to `output` under the run's `idempotency_key`.

    `args.fail_attempts: n` (tests and demos): attempts 1..n fail *after* their output is
    written, so the scheduler retries the run and the retry's write is answered, not
    repeated."""
    import dask.dataframe as dd

    from spark.dask_writer import to_quire

    args = ctx.get("args") or {}
    pdf = counts(ctx)
    appended: list[Any] = []
    output = ctx.get("output") or ""
    if output and len(pdf):
        _ensure_output(list(ctx["brokers"]), output, next(iter((ctx.get("stores") or {})
                                                                .values()), ""))
        # One partition, made the same way by every attempt: the same rows under the
        # same (idempotency key, partition 0) identifiers.
        appended = to_quire(dd.from_pandas(pdf, npartitions=1, sort=False),
                            ",".join(ctx["brokers"]), journal=output, framing="jsonl",
                            idempotency_key=ctx["idempotency_key"], scheduler="sync")
    if int(ctx.get("attempt", 1)) <= int(args.get("fail_attempts", 0)):
        raise RuntimeError(f"attempt {ctx.get('attempt')} fails after writing "
                           f"(args.fail_attempts={args['fail_attempts']})")
    return {"rows": int(len(pdf)), "messages": int(pdf["messages"].sum()) if len(pdf) else 0,
            "idempotency_key": ctx["idempotency_key"],
            "appended": [list(a) for a in appended]}
