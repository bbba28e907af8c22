"""What happened during a chaos run: appends (invoke/ok/fail/info) and faults.

Records. Every append carries exactly one self-checking record, one line of ASCII:

    q1 <writer> <seq> <uuid32> <crc32 of the rest> <padding>\\n

so the checker can cut a journal back into records, tell each record's append by its
uuid, and recognise bytes that no append wrote (a bad checksum, or no record at all).

Outcomes (Jepsen's vocabulary). `ok`: acknowledged, with the acked [begin, end).
`fail`: a *definite* failure — the cluster said it did not commit (a status answered
before the commit was sent, UNAVAILABLE included). `info`: an *indefinite* failure —
COMMIT_UNKNOWN (the broker's replication or proxy broke after the commit was sent), a
timeout or a dropped connection after the commit was sent (the client raises
CommitUnknown for both), or any status that does not rule a commit out. An `info`
append may be in the journal once or not at all; a `fail` append must not be. The
writers use the plain Client, which never re-sends an append after its commit was
sent, so each record is sent (committed) at most once and any record found twice is a
duplicate the cluster made.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from protocol import Status

__all__ = ["Record", "make_record", "parse_records", "Op", "FaultRecord", "History",
           "DEFINITE_STATUSES"]

MAGIC = b"q1"

DEFINITE_STATUSES = frozenset({
    Status.JOURNAL_NOT_FOUND,
    Status.NO_JOURNAL_PRIMARY_BROKER,
    Status.NOT_JOURNAL_PRIMARY_BROKER,
    Status.INSUFFICIENT_JOURNAL_BROKERS,
    Status.NOT_JOURNAL_BROKER,
    Status.WRONG_ROUTE,
    Status.WRONG_APPEND_OFFSET,
    Status.REGISTER_MISMATCH,
    Status.SUSPENDED,
    Status.NOT_ALLOWED,
    Status.BAD_REQUEST,
    Status.FRAGMENT_STORE_UNHEALTHY,
})
"""Statuses a broker answers only for an append it did not commit. The client's
Unavailable is definite too (raised before the commit was sent, or for an UNAVAILABLE
answer, which brokers give only before the commit reached a replica; see
chaos.writers.classify). Everything else (COMMIT_UNKNOWN, ABORTED, PROPOSAL_MISMATCH,
INDEX_HAS_GREATER_OFFSET, timeouts, resets) is indefinite."""

_PAD = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@dataclass(frozen=True)
class Record:
    writer: int
    seq: int
    uid: str
    offset: int = -1
    """Where the checker found it (-1 when built by a writer)."""
    length: int = 0


def make_record(writer: int, seq: int, size: int, rng: random.Random) -> tuple[str, bytes]:
    """(uuid, record bytes) of about `size` bytes (at least the ~70-byte header)."""
    uid = uuid.UUID(int=rng.getrandbits(128), version=4).hex
    head = b"%d %d %s" % (writer, seq, uid.encode())
    pad_len = max(0, size - len(head) - 14)  # "q1 " + head + " crc32hex " + pad + "\n"
    pad = bytes(rng.choices(_PAD, k=pad_len)) if pad_len else b""
    body = head + b" " + pad
    crc = zlib.crc32(body)
    return uid, MAGIC + b" " + head + b" %08x " % crc + pad + b"\n"


def _parse_line(line: bytes) -> tuple[int, int, str] | None:
    parts = line.rstrip(b"\n").split(b" ")
    if len(parts) != 6 or parts[0] != MAGIC:
        return None
    _, w, s, uid, crc, pad = parts
    try:
        if zlib.crc32(b"%s %s %s %s" % (w, s, uid, pad)) != int(crc, 16):
            return None
        return int(w), int(s), uid.decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None


def parse_records(data: bytes, base: int = 0) -> tuple[list[Record], list[tuple[int, int]]]:
    """Cut `data` (journal bytes starting at offset `base`) into records.

    Returns the valid records and the [begin, end) spans of bytes that are not a valid
    record (garbage: torn, corrupt or foreign bytes). A final line without its newline
    is garbage too: every append ends with one."""
    records: list[Record] = []
    garbage: list[tuple[int, int]] = []
    pos = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        end = n if nl < 0 else nl + 1
        parsed = _parse_line(data[pos:end]) if nl >= 0 else None
        if parsed is None:
            if garbage and garbage[-1][1] == base + pos:
                garbage[-1] = (garbage[-1][0], base + end)
            else:
                garbage.append((base + pos, base + end))
        else:
            w, s, uid = parsed
            records.append(Record(w, s, uid, base + pos, end - pos))
        pos = end
    return records, garbage


@dataclass
class Op:
    """One append, from invoke to outcome."""

    uid: str
    writer: int
    seq: int
    journal: str
    size: int
    t_invoke: float
    t_done: float = 0.0
    outcome: str = "pending"
    """ok | fail | info | pending (never completed)."""
    begin: int = -1
    end: int = -1
    error: str = ""
    attempts: list[str] = field(default_factory=list)
    """Outcomes of the client's attempts, when it tried more than once."""


@dataclass
class FaultRecord:
    kind: str
    at: float
    """Run-relative seconds the fault started (0 = when writers started)."""
    healed: float = 0.0
    target: str = ""
    journal: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class History:
    """Ops and faults of one run, with times relative to `t0` (monotonic)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.t0 = time.monotonic()
        self.ops: list[Op] = []
        self.faults: list[FaultRecord] = []
        self._out: TextIO | None = open(path, "w") if path else None  # noqa: SIM115

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _log(self, kind: str, obj: Any) -> None:
        if self._out is not None:
            self._out.write(json.dumps({"type": kind, **asdict(obj)}) + "\n")

    def invoke(self, uid: str, writer: int, seq: int, journal: str, size: int) -> Op:
        op = Op(uid, writer, seq, journal, size, self.now())
        self.ops.append(op)
        self._log("invoke", op)
        return op

    def complete(self, op: Op, outcome: str, *, begin: int = -1, end: int = -1,
                 error: str = "", attempts: list[str] | None = None) -> None:
        if outcome not in ("ok", "fail", "info"):
            raise ValueError(f"unknown outcome {outcome!r}")
        op.t_done, op.outcome, op.begin, op.end, op.error = self.now(), outcome, begin, end, error
        if attempts and len(attempts) > 1:
            op.attempts = list(attempts)
        self._log(outcome, op)

    def fault(self, rec: FaultRecord) -> FaultRecord:
        self.faults.append(rec)
        self._log("fault", rec)
        return rec

    def healed(self, rec: FaultRecord) -> None:
        rec.healed = self.now()
        self._log("heal", rec)

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def by_journal(self) -> dict[str, list[Op]]:
        out: dict[str, list[Op]] = {}
        for op in self.ops:
            out.setdefault(op.journal, []).append(op)
        return out

    def counts(self) -> dict[str, int]:
        out = {"invoked": len(self.ops), "ok": 0, "fail": 0, "info": 0, "pending": 0}
        for op in self.ops:
            out[op.outcome] += 1
        return out

    @staticmethod
    def load(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
        with Path(path).open() as f:
            for line in f:
                yield json.loads(line)
