"""Rows to appends, shared by the Spark sink (spark.sink) and Dask (`to_quire`): sink
options, the encoding of an Arrow record batch into messages per journal, and one
task's write — buffer per journal, then one append (one transaction) per journal.
No pyspark or dask import here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .options import OptionError
from .stream_options import split_endpoints

FRAMINGS = ("value", "raw", "jsonl")
KNOWN = {"brokers", "endpoints", "journal", "journalcolumn", "framing", "spillbytes"}
SPARK_OWN = {"checkpointlocation", "queryname"}
"""Options Spark itself passes to a stream writer (ignored)."""


@dataclass(frozen=True)
class SinkOptions:
    brokers: tuple[str, ...]
    journal: str = ""
    journal_column: str = ""
    framing: str = "jsonl"
    spill_bytes: int = 64 << 20


def parse_sink_options(options: Mapping[str, Any], names: Iterable[str],
                       overwrite: bool = False) -> SinkOptions:
    """Validate sink options against the column `names` of what is written."""
    from protocol import ValidationError, validate_journal_name

    opts = {str(k).lower(): "" if v is None else str(v) for k, v in options.items()}
    unknown = sorted(set(opts) - KNOWN - SPARK_OWN)
    if unknown:
        raise OptionError(unknown[0], f"unknown sink option (known: {', '.join(sorted(KNOWN))})")
    if overwrite:
        raise OptionError("mode", "journals are append-only: use mode('append')")
    brokers = split_endpoints(opts.get("brokers") or opts.get("endpoints", ""))
    if not brokers:
        raise OptionError("brokers", "required: the coordinators to append to (host:port)")
    names = list(names)
    journal = opts.get("journal", "").strip()
    column = opts.get("journalcolumn", "").strip()
    if journal and column:
        raise OptionError("journalColumn", "give the journal option or journalColumn, not both")
    if journal:
        try:
            validate_journal_name(journal, "journal")
        except ValidationError as exc:
            raise OptionError("journal", exc.reason) from None
    else:
        column = column or "journal"
        if column not in names:
            raise OptionError("journalColumn" if opts.get("journalcolumn") else "journal",
                              f"name the target journal, or give a column {column!r} "
                              f"naming each row's journal (columns: {', '.join(names)})")
    framing = opts.get("framing", "").strip().lower() or ("value" if "value" in names else "jsonl")
    if framing not in FRAMINGS:
        raise OptionError("framing", f"expected one of {FRAMINGS}, got {framing!r}")
    if framing != "jsonl" and "value" not in names:
        raise OptionError("framing", f"framing={framing} appends the `value` column; "
                                     f"there is none (columns: {', '.join(names)})")
    spill = opts.get("spillbytes", "").strip()
    try:
        spill_bytes = int(spill, 0) if spill else 64 << 20
    except ValueError:
        raise OptionError("spillBytes", f"expected an integer, got {spill!r}") from None
    return SinkOptions(brokers=brokers, journal=journal, journal_column=column,
                       framing=framing, spill_bytes=spill_bytes)


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if hasattr(value, "__float__"):
        return float(value)  # Decimal
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def encode_batch(batch: Any, opts: SinkOptions) -> dict[str, list[bytes]]:
    """Messages of one Arrow record batch, grouped by target journal, in row order."""
    cols = batch.schema.names
    targets = ([opts.journal] * batch.num_rows if opts.journal
               else batch.column(cols.index(opts.journal_column)).to_pylist())
    if opts.framing == "jsonl":
        keep = [c for c in cols if c != opts.journal_column]
        rows = batch.select(keep).to_pylist()
        messages = [json.dumps(r, separators=(",", ":"), ensure_ascii=False,
                               default=_json_default).encode() + b"\n" for r in rows]
    else:
        values = batch.column(cols.index("value")).to_pylist()
        tail = b"\n" if opts.framing == "value" else b""
        messages = [(v.encode() if isinstance(v, str) else bytes(v or b"")) + tail
                    for v in values]
    out: dict[str, list[bytes]] = {}
    for target, msg in zip(targets, messages):
        if not target:
            raise OptionError("journalColumn", f"a row has no journal in column "
                                               f"{opts.journal_column!r}")
        out.setdefault(target, []).append(msg)
    return out


Appended = list[tuple[str, int, int, int]]
"""(journal, begin, end, messages) per journal a task appended to."""


def write_task(batches: Iterator[Any], opts: SinkOptions) -> Appended:
    """Buffer a task's rows per journal, then append each journal's buffer once."""
    import tempfile

    from protocol import validate_journal_name
    from quire.client import SyncClient

    buffers: dict[str, Any] = {}
    counts: dict[str, int] = {}
    try:
        for batch in batches:
            for journal, messages in encode_batch(batch, opts).items():
                buf = buffers.get(journal)
                if buf is None:
                    validate_journal_name(journal, "journal")
                    buf = buffers[journal] = tempfile.SpooledTemporaryFile(opts.spill_bytes)
                buf.write(b"".join(messages))
                counts[journal] = counts.get(journal, 0) + len(messages)
        appends = []
        if buffers:
            with SyncClient(list(opts.brokers)) as client:
                for journal in sorted(buffers):
                    buf = buffers[journal]
                    buf.seek(0)
                    result = client.append(journal, buf)
                    appends.append((journal, result.begin, result.end, counts[journal]))
        return appends
    finally:
        for buf in buffers.values():
            buf.close()


def check_journal(opts: SinkOptions) -> None:
    """Fail before any task runs on a journal the cluster does not have."""
    from quire.client import QuireError, SyncClient

    with SyncClient(list(opts.brokers)) as client:
        try:
            client.get_journal(opts.journal)
        except QuireError as exc:
            raise OptionError("journal", f"unknown journal {opts.journal!r}: {exc}") from None
