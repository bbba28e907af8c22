"""Rows to appends, shared by the Spark sink (spark.sink) and Dask (`to_quire`): sink
options, the encoding of an Arrow record batch into messages per journal, and one
task's write — buffer per journal, then one append (one transaction) per journal,
identified by the task's exactly-once ids (spark.exactly_once) unless
`exactly_once=false`. No pyspark or dask import here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .options import OptionError
from .stream_options import split_endpoints

FRAMINGS = ("value", "raw", "jsonl")
KNOWN = {"brokers", "endpoints", "journal", "journalcolumn", "framing", "spillbytes",
         "exactly_once", "idempotency_key"}
ALIASES = {"exactlyonce": "exactly_once", "idempotencykey": "idempotency_key"}
SPARK_OWN = {"checkpointlocation", "queryname"}
"""Options Spark itself passes to a stream writer (ignored)."""


@dataclass(frozen=True)
class SinkOptions:
    brokers: tuple[str, ...]
    journal: str = ""
    journal_column: str = ""
    framing: str = "jsonl"
    spill_bytes: int = 64 << 20
    exactly_once: bool = True
    """Identified appends (producer ids from the write/query, partition, batch)."""
    idempotency_key: str = ""
    """Replaces the write id / query id as the base of the identifiers."""


def parse_sink_options(options: Mapping[str, Any], names: Iterable[str],
                       overwrite: bool = False) -> SinkOptions:
    """Validate sink options against the column `names` of what is written."""
    from protocol import ValidationError, validate_journal_name

    opts = {ALIASES.get(str(k).lower(), str(k).lower()): "" if v is None else str(v)
            for k, v in options.items()}
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
    raw_eo = opts.get("exactly_once", "").strip().lower()
    if raw_eo in ("", "true", "1", "yes", "on"):
        exactly_once = True
    elif raw_eo in ("false", "0", "no", "off"):
        exactly_once = False
    else:
        raise OptionError("exactly_once", f"expected true or false, got {opts['exactly_once']!r}")
    key = opts.get("idempotency_key", "")
    if "idempotency_key" in opts:
        if not key.strip():
            raise OptionError("idempotency_key", "an empty key: give a non-empty string, "
                                                 "or leave the option out")
        if not exactly_once:
            raise OptionError("idempotency_key", "a key identifies exactly-once appends; "
                                                 "it cannot go with exactly_once=false")
    return SinkOptions(brokers=brokers, journal=journal, journal_column=column,
                       framing=framing, spill_bytes=spill_bytes, exactly_once=exactly_once,
                       idempotency_key=key)


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


def write_task(batches: Iterator[Any], opts: SinkOptions, ids: Any = None,
               task: str = "", attempt: str = "") -> Appended:
    """Buffer a task's rows per journal, then append each journal's buffer once.

    `ids` (spark.exactly_once.TaskIds): the task's producer and history; each journal's
    append is then identified (txn 1: the task's first and only append to it), so a
    retried attempt that re-sends it is answered with the first attempt's commit. Its
    content is checked against that commit (check_replay). None: plain appends.
    `task` and `attempt` name the task and its attempt for the test fault hook only."""
    import hashlib
    import tempfile

    from protocol import validate_journal_name
    from quire.client import SyncClient

    from .exactly_once import fault_after_append

    buffers: dict[str, Any] = {}
    counts: dict[str, int] = {}
    sums: dict[str, Any] = {}
    try:
        for batch in batches:
            for journal, messages in encode_batch(batch, opts).items():
                buf = buffers.get(journal)
                if buf is None:
                    validate_journal_name(journal, "journal")
                    buf = buffers[journal] = tempfile.SpooledTemporaryFile(opts.spill_bytes)
                    sums[journal] = hashlib.sha1()
                data = b"".join(messages)
                buf.write(data)
                if ids is not None:
                    sums[journal].update(data)
                counts[journal] = counts.get(journal, 0) + len(messages)
        appends = []
        if buffers:
            with SyncClient(list(opts.brokers)) as client:
                for journal in sorted(buffers):
                    buf = buffers[journal]
                    buf.seek(0)
                    if ids is None:
                        result = client.append(journal, buf)
                    else:
                        result = client.append(journal, buf, txn=ids.txn(1))
                        commit = result.commit
                        if commit is not None and commit.sum != sums[journal].hexdigest():
                            check_replay(client, journal, result.begin, result.end, buf,
                                         opts.framing, ids)
                    appends.append((journal, result.begin, result.end, counts[journal]))
            fault_after_append(task, attempt)
        return appends
    finally:
        for buf in buffers.values():
            buf.close()


class ReplayMismatch(RuntimeError):
    """A re-run task's rows differ from those its first attempt committed."""


def check_replay(client: Any, journal: str, begin: int, end: int, buf: Any, framing: str,
                 ids: Any) -> None:
    """The broker answered this task's txn with a commit of other bytes: an earlier
    attempt of the task committed, and this attempt computed different content. The
    same messages in another order (a shuffle's fetch order) are the same output, and
    already in the journal once. Anything else would be dropped silently: refuse."""
    buf.seek(0)
    ours = buf.read()
    theirs = client.read_all(journal, begin, end_offset=end)[:end - begin]
    if framing != "raw" and sorted(ours.splitlines()) == sorted(theirs.splitlines()):
        return
    raise ReplayMismatch(
        f"journal {journal!r}: this task's transaction (producer {ids.producer!r}, history "
        f"{ids.history}) was already committed at [{begin}, {end}) by an earlier attempt "
        f"with other rows ({len(theirs)} bytes committed, {len(ours)} now). Exactly-once "
        f"needs a retried task or re-run batch to compute the same rows per partition; "
        f"write with exactly_once=false or a new idempotency_key to append them anyway")


def check_journal(opts: SinkOptions) -> None:
    """Fail before any task runs on a journal the cluster does not have."""
    from quire.client import QuireError, SyncClient

    with SyncClient(list(opts.brokers)) as client:
        try:
            client.get_journal(opts.journal)
        except QuireError as exc:
            raise OptionError("journal", f"unknown journal {opts.journal!r}: {exc}") from None
