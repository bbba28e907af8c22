"""Dask: the sink's write path for a Dask DataFrame.

    from spark.dask_writer import to_quire
    to_quire(ddf, "broker-1:8080", journal="topics/counts/part-000")   # or journal_column=

Each partition is one task: its rows are encoded as the Spark sink encodes them
(spark.appender: a `value` column plus a newline, or each row as a JSON line) and
appended as one transaction per journal, all or nothing.

Exactly-once (the default): `to_quire` makes one write id on the client and names the
graph's write tasks by it, `("quire-write-<write id>", <partition index>)`; each task's
appends are identified from that write id and its partition index (spark.exactly_once),
so a task the scheduler runs again — its worker died after the append committed, or
the partition was recomputed — re-sends the same transaction and lands once.
`idempotency_key=` replaces the write id (writes with the same key and partitioning land
once, across processes); `exactly_once=False` makes plain appends (at-least-once).
"""

from __future__ import annotations

from typing import Any

from .appender import Appended, SinkOptions, check_journal, parse_sink_options, write_task
from .exactly_once import TaskIds, new_write_id


def _write_partition(pdf: Any, opts: SinkOptions, base: str, index: int) -> Appended:
    import pyarrow as pa

    batch = pa.RecordBatch.from_pandas(pdf, preserve_index=False)
    ids = TaskIds.batch(base, index) if opts.exactly_once else None
    return write_task(iter([batch]), opts, ids, f"{base}#{index}")


def to_quire(ddf: Any, brokers: str, *, journal: str = "", journal_column: str = "",
             framing: str = "", exactly_once: bool = True, idempotency_key: str | None = None,
             scheduler: Any = None, retries: int | None = None) -> Appended:
    """Append every partition of `ddf`; returns (journal, begin, end, messages) per append.

    `scheduler`: as for `dask.compute` (a `distributed.Client` works too); `retries`:
    how many times a failed task is run again (distributed schedulers)."""
    import dask

    options: dict[str, Any] = {"brokers": brokers, "journal": journal,
                               "journalColumn": journal_column, "framing": framing}
    options = {k: v for k, v in options.items() if v}
    options["exactly_once"] = "true" if exactly_once else "false"
    if idempotency_key is not None:
        options["idempotency_key"] = idempotency_key
    opts = parse_sink_options(options, list(ddf.columns))
    if opts.journal:
        check_journal(opts)
    write_id = new_write_id()
    base = opts.idempotency_key or f"write/{write_id}"
    parts = [dask.delayed(_write_partition, pure=False)(
                 part, opts, base, i, dask_key_name=(f"quire-write-{write_id}", i))
             for i, part in enumerate(ddf.to_delayed())]
    kwargs: dict[str, Any] = {} if retries is None else {"retries": retries}
    results = dask.compute(*parts, scheduler=scheduler, **kwargs)
    return [a for appended in results for a in appended]
