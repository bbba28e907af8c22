"""Rows as Arrow: the columns of a quire read, shared by the Spark source and Dask.

Base columns: `journal` (string), `offset` (int64: the journal offset where the
message starts), `value` (string; binary for `raw` framing; delimiter stripped) and
`fragment` (string: the store key of the fragment the message starts in). With `jsonl`
framing any other requested column is parsed from the message's JSON object, by name.
`mode=index` rows describe fragments instead (INDEX_FIELDS).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from protocol import QuireError

from .framing import (BATCH_BYTES, MessageBatch, StoreRef, read_span, repeated,
                      strip_delimiters)

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from .planner import Span

BASE_FIELDS = ("journal", "offset", "value", "fragment")
INDEX_DDL = ("journal string, begin bigint, end bigint, length bigint, sum string, "
             "codec string, key string, store string, mod_time bigint, path_postfix string")


class FramingError(QuireError):
    """Message content cannot be parsed as the requested framing/schema."""


def base_ddl(framing: str) -> str:
    value = "binary" if framing == "raw" else "string"
    return f"journal string, offset bigint, value {value}, fragment string"


def base_arrow_schema(framing: str) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("journal", pa.string()), ("offset", pa.int64()),
                      ("value", pa.binary() if framing == "raw" else pa.string()),
                      ("fragment", pa.string())])


def spark_arrow_schema(schema: Any, framing: str) -> pa.Schema:
    """A Spark read schema as Arrow; JSON columns (beyond the base ones) need jsonl."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    extra = [f.name for f in arrow_schema if f.name not in BASE_FIELDS]
    if extra and framing != "jsonl":
        raise FramingError(f"option 'framing': columns {extra} are parsed from JSON and "
                           f"need framing=jsonl, not {framing!r}")
    return arrow_schema


def index_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("journal", pa.string()), ("begin", pa.int64()), ("end", pa.int64()),
                      ("length", pa.int64()), ("sum", pa.string()), ("codec", pa.string()),
                      ("key", pa.string()), ("store", pa.string()), ("mod_time", pa.int64()),
                      ("path_postfix", pa.string())])


def index_rows(fragments: list[Any], store_url: str) -> list[tuple[Any, ...]]:
    from fragment_store.keys import fragment_key

    return [(f.journal, f.begin, f.end, f.end - f.begin, f.sum, f.codec.value, fragment_key(f),
             f.backing_store or store_url, f.mod_time, f.path_postfix) for f in fragments]


def _bounds(values: pa.Array) -> Any:
    """The n+1 value offsets of a binary array, as a numpy view (zero-copy)."""
    import numpy as np
    import pyarrow as pa

    width = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    raw = np.frombuffer(values.buffers()[1], dtype=width)
    return raw[values.offset:values.offset + len(values) + 1]


def _parse_json(values: pa.Array, fields: list[pa.Field], batch: MessageBatch) -> pa.Table:
    """Parse newline-terminated JSON objects (one per value) into `fields`."""
    import pyarrow as pa
    import pyarrow.json as pj

    if len(values):
        bounds = _bounds(values)
        lo, hi = int(bounds[0]), int(bounds[-1])
        buf = values.buffers()[2].slice(lo, hi - lo)
    else:
        buf = pa.py_buffer(b"")
    try:
        table = pj.read_json(
            pa.BufferReader(buf),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(len(buf) + 1, 1 << 16)),
            parse_options=pj.ParseOptions(explicit_schema=pa.schema(fields),
                                          unexpected_field_behavior="ignore",
                                          newlines_in_values=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        lo = int(batch.offsets[0]) if len(batch) else -1
        raise FramingError(f"journal {batch.journal}: messages from offset {lo} are not JSON "
                           f"objects matching the schema: {exc}") from None
    if table.num_rows != len(values):
        raise FramingError(f"journal {batch.journal}: parsed {table.num_rows} JSON rows from "
                           f"{len(values)} messages (a message is not one JSON object)")
    return table


def to_record_batch(batch: MessageBatch, schema: pa.Schema, framing: str) -> pa.RecordBatch:
    """The columns `schema` asks for, from one framed batch."""
    import numpy as np
    import pyarrow as pa

    values, offsets, fragments = batch.values, pa.array(batch.offsets, pa.int64()), batch.fragments
    if framing == "jsonl":  # blank lines (a lone delimiter) are not messages
        keep = np.diff(_bounds(values)) > 1
        if not keep.all():
            mask = pa.array(keep)
            values, offsets, fragments = (values.filter(mask), offsets.filter(mask),
                                          fragments.filter(mask))
    n = len(values)
    parsed = None
    extra = [f for f in schema if f.name not in BASE_FIELDS]
    if extra:
        if framing != "jsonl":
            raise FramingError(f"columns {[f.name for f in extra]} need framing=jsonl")
        parsed = _parse_json(values, extra, batch)
    columns = []
    for f in schema:
        if f.name == "journal":
            col: Any = (repeated(batch.journal, n, pa.types.is_large_string(f.type))
                        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                        else pa.repeat(pa.scalar(batch.journal, f.type), n))
        elif f.name == "offset":
            col = offsets
        elif f.name == "value":
            col = strip_delimiters(values) if framing != "raw" else values
            if pa.types.is_string(f.type) and pa.types.is_binary(col.type):
                col = col.view(pa.string())  # zero-copy; Spark keeps bytes as they are
            elif pa.types.is_large_string(f.type) and pa.types.is_large_binary(col.type):
                col = col.view(pa.large_string())
        elif f.name == "fragment":
            col = fragments
        else:
            assert parsed is not None
            col = parsed.column(f.name).combine_chunks()
        if col.type != f.type:
            col = col.cast(f.type)
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_record_batches(span: Span, ref: StoreRef, schema: pa.Schema, framing: str,
                        batch_bytes: int = BATCH_BYTES) -> Iterator[pa.RecordBatch]:
    """The rows of one span as record batches of `schema` (what executors yield)."""
    for batch in read_span(span, ref, framing=framing, batch_bytes=batch_bytes):
        if len(batch):
            yield to_record_batch(batch, schema, framing)
