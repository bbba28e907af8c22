"""The Dask reader: the same plan and framing as the Spark source, for one machine.

    from spark.dask_reader import read_journals
    ddf = read_journals("file:///data/quire/", selector="prefix=topics/clicks/")
    ddf.groupby("journal").offset.count().compute()

`read_journals` takes the Spark source's options as keyword arguments (`journal`,
`selector`, `begin`, `end`, `framing`, `columns`/`schema`, ...) and builds a Dask
DataFrame with `dd.from_map`, one partition per planned span; `read_bag` builds a
`dask.bag` of `(journal, offset, value)` tuples. Workers read the store directly.
"""

from __future__ import annotations

from typing import Any

from .options import ReadOptions, parse_options
from .planner import Span


def _arrow_schema(opts: ReadOptions, schema: Any) -> Any:
    """The requested columns as a pyarrow schema: base columns and/or JSON fields.

    `schema` may be a pyarrow Schema, a mapping of name -> pyarrow type (or a type name
    such as "string", "int64", "timestamp[us, tz=UTC]"), or None for the base columns."""
    import pyarrow as pa

    from .arrow import base_arrow_schema

    base = base_arrow_schema(opts.framing)
    if schema is None:
        return base
    if isinstance(schema, pa.Schema):
        return schema
    fields = []
    for name, typ in dict(schema).items():
        if isinstance(typ, str):
            typ = base.field(name).type if typ == "" and name in base.names \
                else pa.type_for_alias(typ) if "[" not in typ else _parse_type(typ)
        fields.append(pa.field(name, typ))
    return pa.schema(fields)


def _parse_type(text: str) -> Any:
    import pyarrow as pa

    if text.startswith("timestamp["):
        unit, _, tz = text[len("timestamp["):-1].partition(",")
        tz = tz.strip().removeprefix("tz=") or None
        return pa.timestamp(unit.strip(), tz=tz)
    return pa.type_for_alias(text)


def read_span_frame(span: Span, opts: ReadOptions, schema: Any) -> Any:
    """One partition: a pandas DataFrame of the span's rows."""
    import pyarrow as pa

    from .arrow import read_record_batches
    from .framing import StoreRef

    ref = StoreRef(opts.store, opts.store_options, opts.verify, opts.fallback_stores)
    batches = list(read_record_batches(span, ref, schema, opts.framing, opts.batch_bytes))
    table = pa.Table.from_batches(batches, schema=schema)
    return table.to_pandas(types_mapper=_types_mapper)


def _types_mapper(typ: Any) -> Any:
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pd.StringDtype("pyarrow")
    return None


def plan(**options: Any) -> tuple[ReadOptions, list[Span]]:
    """Parse options and plan the read (driver side), as the Spark source does."""
    from .catalog import plan_read

    opts = parse_options({k: v for k, v in options.items() if v is not None})
    if opts.mode != "messages":
        raise ValueError("the Dask reader reads messages; use fragment_index() for mode=index")
    return opts, plan_read(opts)


def read_journals(store: str, *, schema: Any = None, **options: Any) -> Any:
    """A Dask DataFrame of the messages of the selected journals (one partition per span)."""
    import dask.dataframe as dd

    opts, spans = plan(store=store, **options)
    arrow_schema = _arrow_schema(opts, schema)
    meta = arrow_schema.empty_table().to_pandas(types_mapper=_types_mapper)
    if not spans:
        return dd.from_pandas(meta, npartitions=1)
    return dd.from_map(read_span_frame, spans, opts=opts, schema=arrow_schema, meta=meta,
                       label="quire-read", enforce_metadata=False)


def _span_tuples(span: Span, opts: ReadOptions) -> list[tuple[str, int, bytes]]:
    from .framing import StoreRef, read_span, strip_delimiters

    ref = StoreRef(opts.store, opts.store_options, opts.verify, opts.fallback_stores)
    out: list[tuple[str, int, bytes]] = []
    for b in read_span(span, ref, framing=opts.framing, batch_bytes=opts.batch_bytes):
        values = b.values if opts.framing == "raw" else strip_delimiters(b.values)
        out.extend(zip([span.journal] * len(b), b.offsets.tolist(), values.to_pylist()))
    return out


def read_bag(store: str, **options: Any) -> Any:
    """A dask.bag of (journal, offset, value bytes), one partition per span."""
    import dask.bag as db

    opts, spans = plan(store=store, **options)
    if not spans:
        return db.from_sequence([], npartitions=1)
    return db.from_sequence(spans, npartitions=len(spans)).map_partitions(
        lambda part: [t for span in part for t in _span_tuples(span, opts)])


def fragment_index(store: str, **options: Any) -> Any:
    """The covering sets of the selected journals as a pandas DataFrame (mode=index)."""
    import pandas as pd

    from .arrow import index_arrow_schema, index_rows
    from .catalog import load_indexes

    opts = parse_options({"store": store, **{k: v for k, v in options.items() if v is not None}})
    rows = [r for _, frags in sorted(load_indexes(opts).items())
            for r in index_rows([f for f in frags if f.end > opts.begin
                                 and (opts.end is None or f.begin < opts.end)], opts.store)]
    return pd.DataFrame(rows, columns=index_arrow_schema().names)
