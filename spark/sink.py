"""`df.write.format("quire")` and `writeStream.format("quire")`: rows appended to journals.

    (df.write.format("quire").option("brokers", "broker-1:8080")
       .option("journal", "topics/counts/part-000").mode("append").save())

Each Spark task buffers its rows per target journal (a spooled temporary file, on disk
past `spillBytes`) and, once its input is exhausted, appends each journal's buffer as
**one append: one transaction per journal per task**, all of it or none of it. A task
that dies before or during an append leaves nothing of that journal's output (the
coordinator rolls back an append whose client disconnects before the commit). Writers
append whole messages, so the streaming source's micro-batch ends stay message ends.

Exactly-once (the default): each task is a producer (spark.exactly_once). Its appends
carry identifiers derived from what Spark keeps across retries — the write's id, made
once on the driver when the writer is created, or the streaming query's id and the
micro-batch id, plus the partition — never an attempt number or a random value. So a
retried or speculative attempt of a partition, or a micro-batch re-run after a driver
restart (appended, not yet in Spark's commit log), re-sends the same transaction and
the broker answers it with the first attempt's commit: each row lands once.
`exactly_once=false` makes plain appends (at-least-once per task). The job-level
commit/abort has nothing to undo or finish: each task's transactions are already
committed when the task reports success.

Inside `foreachBatch`, `spark.foreach.write_batch(df, batch_id, **options)` (or the
function `foreach_batch(**options)` returns) writes with an idempotency key of the query id and
the batch id, so a re-run batch lands once there too.

Options (strings, names case-insensitive):

    brokers        coordinator endpoints, host:port[,host:port...] (required)
    journal        the target journal; or
    journalColumn  the column naming each row's journal (default `journal` when the
                   `journal` option is not given)
    framing        value (default when there is a `value` column): the column's bytes
                   (string or binary) plus a newline; raw: its bytes as they are;
                   jsonl (default otherwise): each row, minus the journal column, as a
                   JSON object on one line
    spillBytes     buffer size per journal before spilling to disk (default 64 MiB)
    exactly_once   true (default): identified appends, each row once across task retries,
                   speculation and re-run micro-batches; false: plain appends
    idempotency_key  replaces the write id / query id as the base of the identifiers
                   (still combined with the partition, and the batch id when streaming):
                   writes with the same key and partitioning land once, even from
                   different applications
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from .appender import SinkOptions, check_journal, write_task
from .appender import parse_sink_options as _parse_names
from .exactly_once import SinkIdentityError, TaskIds, fault_stream_commit, new_write_id

QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"
"""The local properties Spark sets for the jobs of a streaming micro-batch."""


def parse_sink_options(options: Mapping[str, Any], schema: Any,
                       overwrite: bool = False) -> SinkOptions:
    return _parse_names(options, [f.name for f in schema.fields], overwrite)


@dataclass
class QuireCommitMessage(WriterCommitMessage):
    """What a task appended: (journal, begin, end, messages) per journal."""

    appends: list[tuple[str, int, int, int]]


class QuireWriter(DataSourceArrowWriter):
    """Batch writes (`df.write.format("quire")`)."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self.options = options
        # Made here, on the driver, once per write: Spark pickles this writer to every
        # attempt of every task, so all attempts of a partition share it.
        self.write_id = new_write_id()
        if options.journal:
            check_journal(options)

    def write(self, iterator: Iterator[Any]) -> QuireCommitMessage:
        tc = _task_context()
        base = self.options.idempotency_key or f"write/{self.write_id}"
        ids = TaskIds.batch(base, tc.partitionId()) if self.options.exactly_once else None
        task = f"{base}#{tc.partitionId()}"
        return QuireCommitMessage(write_task(iterator, self.options, ids, task, _attempt(tc)))

    def commit(self, messages: list[Any]) -> None:
        pass  # every task's appends committed when the task succeeded

    def abort(self, messages: list[Any]) -> None:
        pass  # committed appends stay; a new .save() is a new write (new write id)


class QuireStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes (`writeStream.format("quire")`), one micro-batch at a time."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self.options = options
        if options.journal:
            check_journal(options)

    def write(self, iterator: Iterator[Any]) -> QuireCommitMessage:
        tc = _task_context()
        ids = None
        query, batch = tc.getLocalProperty(QUERY_ID), tc.getLocalProperty(BATCH_ID)
        if self.options.exactly_once:
            if not query or batch is None or not str(batch).isdigit():
                raise SinkIdentityError(
                    f"the task has no streaming query id or batch id (local properties "
                    f"{QUERY_ID}={query!r}, {BATCH_ID}={batch!r}): set exactly_once=false")
            base = self.options.idempotency_key or f"query/{query}"
            ids = TaskIds.stream(base, int(batch), tc.partitionId())
        task = f"{query}#{batch}#{tc.partitionId()}"
        return QuireCommitMessage(write_task(iterator, self.options, ids, task, _attempt(tc)))

    def commit(self, messages: list[Any], batchId: int) -> None:
        # The tasks' appends are committed; Spark logs the batch after this returns.
        fault_stream_commit(batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        pass


def _task_context() -> Any:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise SinkIdentityError("not in a Spark task: no TaskContext")
    return tc


def _attempt(tc: Any) -> str:
    """Names the attempt for the fault hook's markers only; never part of an identifier."""
    return f"{tc.stageId()}.{tc.partitionId()}.{tc.attemptNumber()}"

