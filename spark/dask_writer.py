"""Dask: the sink's write path for a Dask DataFrame.

    from spark.dask_writer import to_quire
    to_quire(ddf, "broker-1:8080", journal="topics/counts/part-000")   # or journal_column=

Each partition is one task: its rows are encoded as the Spark sink encodes them
(spark.appender: a `value` column plus a newline, or each row as a JSON line) and
appended as one transaction per journal, all or nothing. A partition recomputed after
its appends committed appends again (at-least-once, as the Spark sink).
"""

from __future__ import annotations

from typing import Any

from .appender import Appended, SinkOptions, check_journal, parse_sink_options, write_task


def _write_partition(pdf: Any, opts: SinkOptions) -> Appended:
    import pyarrow as pa

    batch = pa.RecordBatch.from_pandas(pdf, preserve_index=False)
    return write_task(iter([batch]), opts)


def to_quire(ddf: Any, brokers: str, *, journal: str = "", journal_column: str = "",
             framing: str = "", scheduler: str | None = None) -> Appended:
    """Append every partition of `ddf`; returns (journal, begin, end, messages) per append."""
    import dask

    options = {"brokers": brokers, "journal": journal, "journalColumn": journal_column,
               "framing": framing}
    opts = parse_sink_options({k: v for k, v in options.items() if v}, list(ddf.columns))
    if opts.journal:
        check_journal(opts)
    parts = [dask.delayed(_write_partition)(part, opts) for part in ddf.to_delayed()]
    results = dask.compute(*parts, scheduler=scheduler)
    return [a for appended in results for a in appended]
