"""`spark.readStream.format("quire")`: journals as a Structured Streaming source.

    df = (spark.readStream.format("quire")
          .option("store", "s3://bucket/quire/").option("brokers", "broker-1:8080")
          .option("selector", "prefix=topics/clicks/")
          .option("startingOffsets", "earliest").option("maxBytesPerTrigger", 64 << 20)
          .load())

Offsets are `{journal: byte offset}` maps, checkpointed by Spark. `latestOffset` asks
the coordinators for each journal's write head (re-resolving the selector, so journals
created since the last trigger join at offset 0); `partitions(start, end)` lists each
journal's fragment index and plans the persisted part as store spans — read straight
from the store, as a batch read — and the rest as one `Tail` partition that executors
read from the coordinators (spark.offsets, spark.tail). Without `brokers` the stream
follows the persisted index only.

The reader is pickled to executors: it carries options and the Arrow schema; its
driver-side client is dropped from the pickle.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from .offsets import Tail
from .stream_options import StreamOptions
from .stream_plan import StreamPlanning


class StreamPartition(InputPartition):
    """A store span (spark.planner.Span) or a coordinator tail (spark.offsets.Tail)."""

    def __init__(self, part: Any) -> None:
        super().__init__(part)
        self.part = part

    def __repr__(self) -> str:
        p = self.part
        kind = "tail" if isinstance(p, Tail) else "span"
        return f"StreamPartition({kind} {p.journal}@[{p.begin}, {p.end}))"


class QuireStreamReader(StreamPlanning, DataSourceStreamReader):
    def __init__(self, options: StreamOptions, schema: Any) -> None:
        from .arrow import spark_arrow_schema

        self.options = options
        # Same schema checks as a batch read (JSON columns need jsonl framing).
        self.arrow_schema = spark_arrow_schema(schema, options.read.framing)
        self._client: Any = None
        self._store: Any = None
        # Fail at query start on journals that do not exist (with brokers to ask).
        if options.brokers and options.read.journals:
            self._check_journals(options.read.journals)

    def initialOffset(self) -> dict:
        return self.initial_offsets()

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

        if self.options.max_bytes:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return self.end_offsets(start, getattr(limit, "max_bytes", None))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [StreamPartition(p) for p in self.plan_parts(start, end)]

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the journals keep their content

    def stop(self) -> None:
        self.close_client()

    # -- executor side ------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        opts = self.options.read
        part = partition.part  # type: ignore[attr-defined]
        if isinstance(part, Tail):
            from .tail import tail_batches

            yield from tail_batches(part, self.options.brokers, self.arrow_schema,
                                    opts.framing, opts.batch_bytes)
            return
        from .arrow import read_record_batches
        from .framing import StoreRef

        ref = StoreRef(opts.store, opts.store_options, opts.verify, opts.fallback_stores)
        yield from read_record_batches(part, ref, self.arrow_schema, opts.framing,
                                       opts.batch_bytes)
