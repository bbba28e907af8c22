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

Everything here pickles: the reader carries only parsed options and the Arrow schema
(as DDL), partitions carry a `Span`; libraries are imported inside methods.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

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
        from .options import parse_options

        # Validate eagerly, so a bad option fails at .load() with a message naming it.
        self.read_options = parse_options(dict(options))

    def schema(self) -> str:
        from .arrow import INDEX_DDL, base_ddl

        if self.read_options.mode == "index":
            return INDEX_DDL
        return base_ddl(self.read_options.framing)

    def reader(self, schema: Any) -> DataSourceReader:
        if self.read_options.mode == "index":
            return QuireIndexReader(self.read_options)
        return QuireReader(self.read_options, schema)


class QuireReader(DataSourceReader):
    def __init__(self, options: Any, schema: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        from .arrow import BASE_FIELDS, FramingError

        self.options = options
        arrow_schema = to_arrow_schema(schema, timezone="UTC")
        extra = [f.name for f in arrow_schema if f.name not in BASE_FIELDS]
        if extra and options.framing != "jsonl":
            raise FramingError(f"option 'framing': columns {extra} are parsed from JSON and "
                               f"need framing=jsonl, not {options.framing!r}")
        # Arrow schemas pickle; keep the wire types Spark expects.
        self.arrow_schema = arrow_schema

    def partitions(self) -> list[InputPartition]:
        from .catalog import plan_read

        return [QuirePartition(span) for span in plan_read(self.options)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from .arrow import read_record_batches
        from .framing import StoreRef

        opts = self.options
        ref = StoreRef(opts.store, opts.store_options, opts.verify)
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


def register(spark: Any) -> None:
    """Register the `quire` format on a SparkSession (idempotent)."""
    spark.dataSource.register(QuireDataSource)
