"""`df.write.format("quire")` and `writeStream.format("quire")`: rows appended to journals.

    (df.write.format("quire").option("brokers", "broker-1:8080")
       .option("journal", "topics/counts/part-000").mode("append").save())

Each Spark task buffers its rows per target journal (a spooled temporary file, on disk
past `spillBytes`) and, once its input is exhausted, appends each journal's buffer as
**one append: one transaction per journal per task**, all of it or none of it. A task
that dies before or during an append leaves nothing of that journal's output (the
coordinator rolls back an append whose client disconnects before the commit). Writers
append whole messages, so the streaming source's micro-batch ends stay message ends.

Retries: a task retried after its appends committed appends its output again, and a
streaming query restarted after a batch's appends but before Spark logged the batch as
committed writes that batch again — the sink is at-least-once per task until
exactly-once appends (producer identifiers) are available to feed the task's identity
into. The job-level commit/abort has nothing to undo or finish: each task's transactions
are already committed when the task reports success.

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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from .appender import SinkOptions, check_journal, write_task
from .appender import parse_sink_options as _parse_names


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
        if options.journal:
            check_journal(options)

    def write(self, iterator: Iterator[Any]) -> QuireCommitMessage:
        return QuireCommitMessage(write_task(iterator, self.options))

    def commit(self, messages: list[Any]) -> None:
        pass  # every task's appends committed when the task succeeded

    def abort(self, messages: list[Any]) -> None:
        pass  # appends that committed stay (at-least-once, see the module docstring)


class QuireStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes (`writeStream.format("quire")`), one micro-batch at a time."""

    def __init__(self, options: SinkOptions, schema: Any) -> None:
        self.options = options
        if options.journal:
            check_journal(options)

    def write(self, iterator: Iterator[Any]) -> QuireCommitMessage:
        return QuireCommitMessage(write_task(iterator, self.options))

    def commit(self, messages: list[Any], batchId: int) -> None:
        pass

    def abort(self, messages: list[Any], batchId: int) -> None:
        pass
