"""The marks log: the producer table's record on disk, so deduplication survives a
kill -9 of every replica of a journal (docs/exactly-once.md, "What survives what").

The producer table (producers.py, pure) lives in the replica's spool and travels with
commit proposals and syncs; a graceful exit writes it into the spool's `.head.json`.
A crash of every replica at once leaves neither. This log, beside the spool at
`<spool_dir>/<journal>/.producers.log`, is its crash record: every change to the table
is appended as one small record, in the order the spool made it:

* `Marked(mark)`     a commit carrying the mark was adopted (producers.apply);
* `Restored(snap)`   the whole table was replaced (a roll forward to a peer, a recorded
                     head) — also the compacted form of the log;
* `Dropped(end)`     marks past `end` were forgotten (a superseded primary's
                     unacknowledged commits left the spool: producers.drop_after);
* `Sealed(end)`      the spool closed a fragment ending at `end`: its bytes are in a
                     sealed file (`<begin>-<end>-<sum>.raw`) that a restart recovers.

**Why the seal matters.** At a restart after a crash the open spool is dropped
(recovery.py: which of its bytes were committed is unknown), so its transactions are
gone from the journal. A mark must never claim a transaction whose bytes did not
survive, or a re-send would be answered with offsets that hold nothing (or other
bytes). So replay rebuilds the table as it was at the last `Sealed` record — every
later record describes the open spool — plus the marks of a sealed fragment file found
on disk at the restart (the process died between the file's seal and its record); a
re-send of a transaction after that is written again, once. The durability step is the
spool's own: records are written with `os.write` as the spool adopts the commits they
describe (no fsync, as the spool has none), buffered up to `FLUSH_RECORDS` and always
written before a spool file is sealed, so a sealed fragment's marks survive a kill -9 of
the process exactly as its file does; an operating-system crash loses the page cache of
both.

**Bounded.** At a seal, once the file has passed `max(COMPACT_BYTES, 2 x its size after
the last rewrite)`, it is rewritten as `[Restored(table), Sealed(end)]` (tmp file +
rename: whole or absent, never torn). The table is bounded (producers.py), so the log
is bounded by ~2 snapshots (< ~1.5 MiB) plus one fragment's identified commits
(~90 bytes each) — a fragment's length, or its flush interval, bounds those.

**Torn records.** Each write is one frame `u32 length | u32 crc32 | msgpack [records]`;
replay stops at the first short or corrupt frame (a kill mid-write tears only the
last), and the log is rewritten at open, so new records never follow a torn one.

The codec and `replay()` are pure (bytes in, table out); `MarksLog` is the file and
`LoggedProducerTable` the table that writes through it.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from protocol import ProducerMark, ProducerSnapshot

from .producers import DEFAULT_EXPIRY, DEFAULT_LIMIT, ProducerTable

__all__ = ["COMPACT_BYTES", "FLUSH_RECORDS", "LOG_FILE", "Dropped", "LoggedProducerTable", "Marked",
           "MarksLog", "Record", "Replayed", "Restored", "Sealed", "decode_records",
           "encode_record", "encode_records", "replay"]

LOG_FILE = ".producers.log"
"""No journal name segment starts with '.', so this never collides with a journal."""
COMPACT_BYTES = 256 << 10
"""The log is rewritten as one snapshot once it passes max(this, 2 x its last rewrite)."""
FLUSH_RECORDS = 256
"""Records buffered before one write (a seal flushes sooner)."""


class Marked(msgspec.Struct, frozen=True, array_like=True, tag="m"):
    mark: ProducerMark


class Restored(msgspec.Struct, frozen=True, array_like=True, tag="r"):
    snapshot: ProducerSnapshot


class Dropped(msgspec.Struct, frozen=True, array_like=True, tag="d"):
    end: int


class Sealed(msgspec.Struct, frozen=True, array_like=True, tag="s"):
    end: int


Record = Marked | Restored | Dropped | Sealed

_HEAD = struct.Struct("<II")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[Record])


def encode_records(records: list[Record]) -> bytes:
    """One frame holding `records`: written, and read back, all or none."""
    body = _encoder.encode(records)
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def encode_record(rec: Record) -> bytes:
    return encode_records([rec])


@dataclass(frozen=True, slots=True)
class Replayed:
    sealed: int
    """The furthest seal (or sealed fragment on disk): the table covers bytes below it."""
    applied: int
    """Records applied (the rest describe the open spool, which did not survive)."""
    records: int
    """Whole records read."""
    valid: int
    """Bytes of whole records (a torn tail starts here)."""


def decode_records(data: bytes | memoryview) -> tuple[list[Record], int]:
    """The whole records of `data`, and their length in bytes (a torn tail is ignored)."""
    view = memoryview(data)
    pos = 0
    out: list[Record] = []
    while pos + _HEAD.size <= len(view):
        size, crc = _HEAD.unpack_from(view, pos)
        body = view[pos + _HEAD.size:pos + _HEAD.size + size]
        if len(body) < size or zlib.crc32(body) != crc:
            break
        try:
            out.extend(_decoder.decode(body))
        except (msgspec.DecodeError, msgspec.ValidationError):
            break
        pos += _HEAD.size + size
    return out, pos


def replay(data: bytes | memoryview, table: ProducerTable | _Unlogged,
           sealed_floor: int = 0) -> Replayed:
    """Rebuild `table` as it was at the log's last seal (pure).

    Records after the last `Sealed` describe the open spool, whose bytes a restart
    drops: they are not applied — except marks of bytes that a sealed fragment file
    found on disk holds (`end <= sealed_floor`: the process died between the file's
    seal and the record). Rolling back to the seal, not merely dropping marks past it,
    matters: the table keeps one mark per history, and a history whose newest mark is
    lost must fall back to its previous one, not be forgotten (which would let an older
    re-send be written twice)."""
    recs, valid = decode_records(data)
    last = max((i for i, r in enumerate(recs) if isinstance(r, Sealed)), default=-1)
    sealed = sealed_floor
    applied = 0
    for i, rec in enumerate(recs):
        if i > last and not (isinstance(rec, Marked) and rec.mark.end <= sealed_floor):
            break
        applied += 1
        if isinstance(rec, Marked):
            table.apply(rec.mark)
        elif isinstance(rec, Sealed):
            sealed = max(sealed, rec.end)
        elif isinstance(rec, Dropped):
            table.drop_after(rec.end)
        else:
            table.restore(rec.snapshot)
    return Replayed(sealed, applied, len(recs), valid)


class MarksLog:
    """The append-only file (O_APPEND) of one journal's marks."""

    def __init__(self, path: str | Path, *, compact_bytes: int = COMPACT_BYTES) -> None:
        self.path = Path(path)
        self.compact_bytes = compact_bytes
        self.size = 0
        self.base = 0
        """Bytes of the last rewrite: written whole (renamed into place), never torn."""
        self._bound = compact_bytes
        self._fd = -1

    def write(self, records: list[Record]) -> None:
        """Append records, in one write."""
        data = encode_records(records)
        if self._fd < 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(data)
        while view:  # a regular file takes it whole (or the process is gone)
            view = view[os.write(self._fd, view):]
        self.size += len(data)

    @property
    def over_bound(self) -> bool:
        """Grown past max(compact_bytes, 2 x the last rewrite): time to compact."""
        return self.size > self._bound

    def rewrite(self, records: list[Record]) -> None:
        """Replace the whole log (whole or absent: tmp file + rename)."""
        self.close()
        data = encode_records(records)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(LOG_FILE + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)
        self.size = self.base = len(data)
        self._bound = max(self.compact_bytes, 2 * self.size)

    def clear(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.size = self.base = 0
        self._bound = self.compact_bytes

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self) -> None:  # a replica dropped from the host: release the fd
        self.close()


class LoggedProducerTable(ProducerTable):
    """A ProducerTable whose every change is also recorded in its MarksLog, plus the
    seals the replica reports. Decisions (`check`) are the pure table's.

    Records are buffered and written in one `os.write` when `flush_records` have
    gathered, just before a spool file is sealed (`flush`, called by the file's seal:
    spool_files.DiskFiles.before_seal) and with each seal's own record (`sealed`,
    after the file is renamed). Buffering loses nothing replay would use: it rolls
    back to the last seal, and every mark before a seal is flushed before the seal's
    file is renamed — so a sealed file found on disk always has its marks in the log."""

    __slots__ = ("log", "sealed_end", "flush_records", "_pending")

    def __init__(self, journal: str, log: MarksLog, *, limit: int = DEFAULT_LIMIT,
                 expiry: float = DEFAULT_EXPIRY, flush_records: int = FLUSH_RECORDS) -> None:
        super().__init__(journal, limit=limit, expiry=expiry)
        self.log = log
        self.sealed_end = 0
        self.flush_records = max(1, flush_records)
        self._pending: list[Record] = []

    @classmethod
    def open(cls, journal: str, path: str | Path, recovered: bytes | None = None,
             sealed_floor: int = 0, **kw) -> LoggedProducerTable:  # noqa: ANN003
        """The table of a replica starting here: replayed from `recovered` (the log a
        previous run left) or empty, its log rewritten compacted (a torn tail is gone)."""
        compact = kw.pop("compact_bytes", COMPACT_BYTES)
        table = cls(journal, MarksLog(path, compact_bytes=compact), **kw)
        if recovered is None:
            # A journal (re)assigned here afresh: a log left by an earlier stay would
            # describe a table its peers have since moved past; the sync brings theirs.
            table.log.clear()
            table.sealed_end = sealed_floor
            return table
        table.sealed_end = replay(recovered, _Unlogged(table), sealed_floor).sealed
        table.compact()
        return table

    @property
    def empty(self) -> bool:
        return not self._gens and not self._hists

    def compact(self) -> None:
        """Rewrite the log as the table (at a seal: nothing may be pending)."""
        self._pending.clear()
        if self.empty:
            self.log.clear()  # the seal is kept in memory and written before a mark
        else:
            self.log.rewrite([Restored(self.snapshot()), Sealed(self.sealed_end)])

    def _write(self, rec: Record) -> None:
        pending = self._pending
        if not pending and self.log.size == 0:
            if self.empty:
                return  # nothing to remember: journals without producers keep no file
            if self.sealed_end and not isinstance(rec, Sealed):
                pending.append(Sealed(self.sealed_end))  # the seals before the first mark
        pending.append(rec)
        if len(pending) >= self.flush_records:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered (before a spool file is sealed, and when full)."""
        if self._pending:
            records, self._pending = self._pending, []
            self.log.write(records)

    def apply(self, mark: ProducerMark) -> None:
        super().apply(mark)
        self._write(Marked(mark))

    def restore(self, snap: ProducerSnapshot) -> None:
        super().restore(snap)
        self._write(Restored(snap))

    def drop_after(self, end: int) -> int:
        n = super().drop_after(end)
        if n:
            self._write(Dropped(end))
        return n

    def sealed(self, end: int) -> None:
        """The spool closed a fragment at `end` and its file is sealed (renamed), so it
        survives a restart. At a seal, the table is exactly the state replay rolls back
        to: the moment to compact, once the log has grown past its bound."""
        if end <= self.sealed_end:
            return
        self.sealed_end = end
        self._write(Sealed(end))
        self.flush()
        if self.log.over_bound:
            self.compact()

    def close(self) -> None:
        self.flush()
        self.log.close()


class _Unlogged:
    """A LoggedProducerTable seen as its pure base (replay must not log again)."""

    def __init__(self, table: LoggedProducerTable) -> None:
        self._t = table

    def apply(self, mark: ProducerMark) -> None:
        ProducerTable.apply(self._t, mark)

    def restore(self, snap: ProducerSnapshot) -> None:
        ProducerTable.restore(self._t, snap)

    def drop_after(self, end: int) -> int:
        return ProducerTable.drop_after(self._t, end)
