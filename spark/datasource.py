"""The PySpark Python Data Source `quire`: journal history read straight from the store.

    from spark.datasource import QuireDataSource
    spark.dataSource.register(QuireDataSource)
    df = (spark.read.format("quire")
          .option("store", "s3://bucket/prefix/")
          .option("selector", "prefix=topics/clicks/")
          .load())

Options (strings; names case-insensitive) are documented in `spark/README.md` and
parsed by `spark.options`. The driver lists the store, builds each journal's covering set and
plans one input partition per fragment (`spark.planner`); executors fetch, decompress
and frame their span and yield pyarrow RecordBatches. No broker, etcd or Redis is on
the read path (etcd only if a selector is resolved with the `etcd` option).

`spark.readStream.format("quire")` is the same source as a stream (spark.stream): extra
options `brokers`, `startingOffsets`, `maxBytesPerTrigger`. `df.write` and `writeStream`
append rows to journals (spark.sink).

Everything here pickles: the reader carries only parsed options and the Arrow schema
(as DDL), partitions carry a `Span`; libraries are imported inside methods.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    InputPartition)

NAME = "quire"


class QuirePartition(InputPartition):
    """One planned span (see spark.planner.Span)."""

    def __init__(self, span: Any) -> None:
        super().__init__(span)
        self.span = span

    def __repr__(self) -> str:
        s = self.span
        return f"QuirePartition({s.journal}@[{s.begin}, {s.end}))"


class QuireDataSource(DataSource):
    """`spark.read.format("quire")`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        from .stream_options import STREAM_ONLY, parse_stream_options

        # Validate eagerly, so a bad option fails at .load() with a message naming it.
        # Options without a store are a sink's (spark.sink parses them at .save()).
        raw = dict(options)
        self.stream_options = None
        keys = {str(k).lower() for k in raw}
        if keys & STREAM_ONLY and keys & {"store", "path"}:
            self.stream_options = parse_stream_options(raw)
            self._read_options = self.stream_options.read
        elif keys & {"store", "path"}:
            self._read_options = _parse(raw)
        else:
            self._read_options = None

    @property
    def read_options(self) -> Any:
        if self._read_options is None:
            self._read_options = _parse(dict(self.options))  # raises: no store
        return self._read_options

    def schema(self) -> str:
        from .arrow import INDEX_DDL, base_ddl

        if self.read_options.mode == "index":
            return INDEX_DDL
        return base_ddl(self.read_options.framing)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from .stream import QuireStreamReader
        from .stream_options import parse_stream_options

        return QuireStreamReader(self.stream_options or parse_stream_options(dict(self.options)),
                                 schema)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from .sink import QuireWriter, parse_sink_options

        return QuireWriter(parse_sink_options(dict(self.options), schema, overwrite), schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from .sink import QuireStreamWriter, parse_sink_options

        return QuireStreamWriter(parse_sink_options(dict(self.options), schema, overwrite),
                                 schema)

    def reader(self, schema: Any) -> DataSourceReader:
        if self.read_options.mode == "index":
            return QuireIndexReader(self.read_options)
        return QuireReader(self.read_options, schema)


class QuireReader(DataSourceReader):
    def __init__(self, options: Any, schema: Any) -> None:
        from .arrow import spark_arrow_schema

        self.options = options
        # Arrow schemas pickle; keep the wire types Spark expects.
        self.arrow_schema = spark_arrow_schema(schema, options.framing)

    def partitions(self) -> list[InputPartition]:
        from .catalog import plan_read

        return [QuirePartition(span) for span in plan_read(self.options)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from .arrow import read_record_batches
        from .framing import StoreRef

        opts = self.options
        ref = StoreRef(opts.store, opts.store_options, opts.verify, opts.fallback_stores)
        yield from read_record_batches(partition.span, ref,  # type: ignore[attr-defined]
                                       self.arrow_schema, opts.framing, opts.batch_bytes)


class QuireIndexReader(DataSourceReader):
    """`mode=index`: the covering set of each selected journal, one row per fragment."""

    def __init__(self, options: Any) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        from .catalog import load_indexes

        indexes = load_indexes(self.options)
        begin, end = self.options.begin, self.options.end
        return [InputPartition([f for f in frags
                                if f.end > begin and (end is None or f.begin < end)])
                for _, frags in sorted(indexes.items())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from .arrow import index_rows

        yield from index_rows(partition.value, self.options.store)


def _parse(raw: dict[str, Any]) -> Any:
    from .options import parse_options

    return parse_options(raw)


def register(spark: Any) -> None:
    """Register the `quire` format on a SparkSession (idempotent)."""
    spark.dataSource.register(QuireDataSource)
