"""The checker: a history and everything read back -> anomaly counts. Pure (no IO).

Inputs, per journal:
  * the ops of the history (`Op`: ok with its acked [begin, end), fail, info, pending);
  * the *final read*: the journal from offset 0 to its head, read through the
    coordinators after the run (the authoritative view);
  * other *views* of the same journal, each a list of (offset, bytes) spans: a read of
    each replica with do_not_proxy, and the content of every persisted fragment;
  * the persisted fragments themselves (`StoredFragment`: name fields, decoded bytes).

Safety counts (each must be 0; Jepsen's Kafka checker names in brackets):
  lost                 an ok append whose record is not at exactly its acked offsets in
                       the final read [lost-write, inconsistent-offsets]
  duplicates           a record that appears more than once [duplicate], counted
                       explicitly (one per extra copy): plain writers send each record's
                       commit at most once, and identified writers (exactly-once, the
                       default) re-send it after an unknown outcome under the same txn id,
                       which the primary must deduplicate — so a second copy is an anomaly
                       whatever the append's outcome; an indefinite append's record may
                       appear 0 or 1 times (indefinite_visible / indefinite_absent)
  written_twice        two ok appends whose acked ranges overlap
  uncommitted_visible  bytes in the final read no append committed: records of definite
                       failures, unknown records, bytes that are no record, and bytes a tail
                       reader saw that differ from the final read or lie past its head
  divergence           a view (replica, store fragment) whose bytes differ from the final
                       read where they overlap, or that holds bytes past the final head
  bad_fragments        a persisted fragment whose length or SHA-1 does not match its
                       name, or that could not be decoded

When the final read fails part-way, or the journal stayed unavailable after healing
(its primary may not have re-synchronised, so its head can be short), the rest of the
journal is reconstructed from replicas and stored fragments (`reconstruct`), so data
that is merely unavailable is not counted as lost; `reconstructed` counts such journals.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .consumer_check import CONSUMER_SAFETY_KEYS
from .history import FaultRecord, Op, parse_records

__all__ = ["StoredFragment", "JournalReadback", "Report", "check", "SAFETY_KEYS"]

BROKER_SAFETY_KEYS = ("lost", "duplicates", "written_twice", "uncommitted_visible", "divergence",
                      "bad_fragments")
SAFETY_KEYS = BROKER_SAFETY_KEYS + CONSUMER_SAFETY_KEYS
"""Every count that makes a run UNSAFE; the consumer ones are chaos/consumer_check.py's
(0 when the run has no consumer group)."""
_EXAMPLES = 5


@dataclass
class StoredFragment:
    key: str
    journal: str
    begin: int
    end: int
    sum: str
    data: bytes | None
    """Decoded content; None if it could not be fetched or decoded."""
    error: str = ""


@dataclass
class JournalReadback:
    journal: str
    final: bytes
    """Bytes [final_begin, final_begin + len(final)) read through the coordinators."""
    final_begin: int = 0
    views: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    """source name -> spans (offset, bytes), e.g. "replica:z1#c2", "store"."""
    fragments: list[StoredFragment] = field(default_factory=list)
    read_error: str = ""
    unavailable: str = ""
    """Set when no barrier append succeeded after healing: the journal stayed down
    (liveness, reported; not a safety count)."""
    holes: list[tuple[int, int]] = field(default_factory=list)
    """[begin, end) ranges the final read jumped over (filled with newlines in `final`):
    reported as `holes`, not a safety count by themselves — an acked append inside one
    is `lost`, and only an indefinite append's bytes may be missing."""
    head_seen: int = -1
    """The write head first reported after healing, before any barrier append (-1 =
    unknown). Below the last acked end it means reads were served from a primary that
    had not yet re-synchronised its pipeline (reported, not a safety count)."""


@dataclass
class Report:
    counts: dict[str, int]
    appends: dict[str, int]
    examples: dict[str, list[str]]
    faults: dict[str, int]
    recovery: dict[str, float | int | None]
    journals: dict[str, dict[str, Any]]
    consumers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per consumer shard: source, committed offset, head, messages, counted, terms."""

    def add_consumers(self, counts: dict[str, int], examples: dict[str, list[str]],
                      shards: dict[str, dict[str, Any]]) -> None:
        """Fold in chaos.consumer_check's result (its safety keys are in SAFETY_KEYS)."""
        self.counts.update(counts)
        self.examples.update(examples)
        self.consumers = shards

    def add_stalls(self, stalls: list[str]) -> None:
        """Waits of the harness that did not finish within their bound (chaos/bounded.py):
        liveness of the run (not a safety count), each named with where it was stuck."""
        self.counts["harness_stalls"] = len(stalls)
        if stalls:
            self.examples["harness_stalls"] = stalls[:_EXAMPLES]

    def add_crashes(self, found: list[str]) -> None:
        """Exceptions the coordinators caught where none was expected (tools/log_crashes.py):
        not a safety count — each a bug, and the run not ok."""
        self.counts["caught_crashes"] = len(found)
        if found:
            self.examples["caught_crashes"] = found[:_EXAMPLES]

    @property
    def safe(self) -> bool:
        return all(self.counts[k] == 0 for k in SAFETY_KEYS)

    def to_json(self) -> dict[str, Any]:
        return {"safe": self.safe, "safety": {k: self.counts[k] for k in SAFETY_KEYS},
                "counts": self.counts, "appends": self.appends, "faults": self.faults,
                "recovery_after_primary_kill_s": self.recovery, "journals": self.journals,
                "consumer_shards": self.consumers, "examples": self.examples}


class _Tally:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {k: 0 for k in SAFETY_KEYS}
        self.counts.update(indefinite_visible=0, indefinite_absent=0, garbage_bytes=0, holes=0,
                           fragments_checked=0, stale_heads=0,
                           unavailable_after_heal=0, reconstructed=0, harness_stalls=0,
                           caught_crashes=0)
        self.examples: dict[str, list[str]] = {}

    def add(self, key: str, example: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n
        ex = self.examples.setdefault(key, [])
        if len(ex) < _EXAMPLES:
            ex.append(example)


def _check_fragments(j: JournalReadback, t: _Tally) -> None:
    for frag in j.fragments:
        t.counts["fragments_checked"] += 1
        where = f"{j.journal}: {frag.key}"
        if frag.data is None:
            t.add("bad_fragments", f"{where}: unreadable: {frag.error}")
            continue
        if len(frag.data) != frag.end - frag.begin:
            t.add("bad_fragments", f"{where}: {len(frag.data)} bytes, name says {frag.end - frag.begin}")
            continue
        if hashlib.sha1(frag.data).hexdigest() != frag.sum:
            t.add("bad_fragments", f"{where}: SHA-1 {hashlib.sha1(frag.data).hexdigest()} != name")


def _overlaps(spans: Iterable[tuple[int, bytes]], final: bytes, base: int
              ) -> Iterable[tuple[int, bytes, bytes | None]]:
    """For each span: (offset, its bytes over the final's range, the final's bytes), and
    (offset, bytes past the final head, None) for any tail beyond it."""
    head = base + len(final)
    for off, data in spans:
        lo, hi = max(off, base), min(off + len(data), head)
        if lo < hi:
            yield lo, data[lo - off:hi - off], final[lo - base:hi - base]
        if off + len(data) > head:
            start = max(off, head)
            yield start, data[start - off:], None


def _outside(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [lo, hi) spans not covered by any hole."""
    out = []
    for lo, hi in spans:
        parts = [(lo, hi)]
        for hlo, hhi in holes:
            parts = [p for a, b in parts for p in ((a, min(b, hlo)), (max(a, hhi), b)) if p[0] < p[1]]
        out.extend(parts)
    return out


def _check_views(j: JournalReadback, t: _Tally) -> None:
    views = dict(j.views)
    views["store"] = views.get("store", []) + [
        (f.begin, f.data) for f in j.fragments
        if f.data is not None and len(f.data) == f.end - f.begin]
    for source, spans in views.items():
        # What a tail reader saw and the final read lacks was never committed [G1a,
        # precommitted-read]; a replica or fragment that differs has diverged.
        key = "uncommitted_visible" if source.startswith("reader") else "divergence"
        for off, got, want in _overlaps(spans, j.final, j.final_begin):
            if want is None:
                t.add(key, f"{j.journal} {source}: {len(got)} bytes at {off} past the "
                           f"final head {j.final_begin + len(j.final)}")
            elif got != want:
                first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
                t.add(key, f"{j.journal} {source}: differs from the final read at "
                           f"offset {off + first}")


def _check_journal(j: JournalReadback, ops: Sequence[Op], t: _Tally) -> dict[str, Any]:
    records, garbage = parse_records(j.final, j.final_begin)
    by_uid: dict[str, list[int]] = {}
    at_offset: dict[int, tuple[str, int]] = {}
    for r in records:
        by_uid.setdefault(r.uid, []).append(r.offset)
        at_offset[r.offset] = (r.uid, r.length)
    ops_by_uid = {op.uid: op for op in ops}
    for lo, hi in j.holes:
        t.add("holes", f"{j.journal}: the final read jumped over [{lo}, {hi}) ({hi - lo} bytes)")
    for lo, hi in _outside(garbage, j.holes):
        t.counts["garbage_bytes"] += hi - lo
        t.add("uncommitted_visible", f"{j.journal}: {hi - lo} bytes at [{lo}, {hi}) are no record")
    for uid, offsets in by_uid.items():
        op = ops_by_uid.get(uid)
        if len(offsets) > 1:
            tried = f"; attempts: {op.attempts}" if op is not None and op.attempts else ""
            t.add("duplicates", f"{j.journal}: record {uid} at offsets {offsets}{tried}",
                  len(offsets) - 1)
        if op is None:
            t.add("uncommitted_visible", f"{j.journal}: record {uid} at {offsets[0]} was never appended")
        elif op.outcome == "fail":
            t.add("uncommitted_visible", f"{j.journal}: record {uid} at {offsets[0]} failed "
                                         f"definitely ({op.error})")
        elif op.outcome in ("info", "pending"):
            t.counts["indefinite_visible"] += 1
    acked = sorted((op for op in ops if op.outcome == "ok"), key=lambda o: (o.begin, o.end))
    for op in acked:
        found = at_offset.get(op.begin)
        if found != (op.uid, op.end - op.begin):
            elsewhere = by_uid.get(op.uid)
            detail = f"found at {elsewhere}" if elsewhere else "not in the journal"
            t.add("lost", f"{j.journal}: ok append {op.uid} acked [{op.begin}, {op.end}), {detail}")
    for prev, op in zip(acked, acked[1:]):
        if op.begin < prev.end:
            t.add("written_twice", f"{j.journal}: acks [{prev.begin}, {prev.end}) {prev.uid} and "
                                   f"[{op.begin}, {op.end}) {op.uid} overlap")
    if j.unavailable:
        t.add("unavailable_after_heal", f"{j.journal}: {j.unavailable}")
    last_acked = max((op.end for op in acked), default=0)
    if 0 <= j.head_seen < last_acked:
        t.add("stale_heads", f"{j.journal}: head {j.head_seen} reported after healing, "
                             f"below the last acked end {last_acked}")
    for op in ops:
        if op.outcome in ("info", "pending") and op.uid not in by_uid:
            t.counts["indefinite_absent"] += 1
    _check_fragments(j, t)
    _check_views(j, t)
    return {"head": j.final_begin + len(j.final), "records": len(records),
            "acked": len(acked), "fragments": len(j.fragments),
            "read_error": j.read_error}


def reconstruct(j: JournalReadback) -> int:
    """When the final read failed part-way, extend it with what replicas and stored
    fragments hold (data that is unavailable is not lost): from the end of what was
    read, repeatedly take the span reaching furthest. Tail-reader views are not used.
    Returns the bytes added; `j.final` is extended in place."""
    spans = [(off, data) for src, sp in j.views.items() if not src.startswith("reader")
             for off, data in sp]
    spans += [(f.begin, f.data) for f in j.fragments if f.data is not None
              and len(f.data) == f.end - f.begin and hashlib.sha1(f.data).hexdigest() == f.sum]
    buf = bytearray(j.final)
    cur = j.final_begin + len(buf)
    while True:
        best = max((s for s in spans if s[0] <= cur < s[0] + len(s[1])),
                   key=lambda s: s[0] + len(s[1]), default=None)
        if best is None:
            break
        buf += best[1][cur - best[0]:]
        cur = best[0] + len(best[1])
    added = len(buf) - len(j.final)
    j.final = bytes(buf)
    return added


def recovery_times(faults: Sequence[FaultRecord], ops: Sequence[Op]) -> list[float]:
    """For each primary kill: seconds from the kill to the completion of the first ok
    append on that journal invoked after it (None-less: kills never followed by an ok
    append are left out and counted by the caller)."""
    out: list[float] = []
    by_journal: dict[str, list[Op]] = {}
    for op in ops:
        if op.outcome == "ok":
            by_journal.setdefault(op.journal, []).append(op)
    for f in faults:
        if f.kind != "kill-primary" or not f.journal:
            continue
        after = [op.t_done for op in by_journal.get(f.journal, []) if op.t_invoke >= f.at]
        if after:
            out.append(min(after) - f.at)
    return out


def check(readbacks: Sequence[JournalReadback], ops: Sequence[Op],
          faults: Sequence[FaultRecord] = ()) -> Report:
    t = _Tally()
    by_journal: dict[str, list[Op]] = {}
    for op in ops:
        by_journal.setdefault(op.journal, []).append(op)
    journals: dict[str, dict[str, Any]] = {}
    seen = set()
    for j in readbacks:
        seen.add(j.journal)
        extended = reconstruct(j) if (j.read_error or j.unavailable) else 0
        if extended:
            why = j.read_error or j.unavailable
            t.add("reconstructed", f"{j.journal}: final read incomplete ({why}); "
                                   f"{extended} bytes taken from replicas and the store")
        journals[j.journal] = _check_journal(j, by_journal.get(j.journal, []), t)
        journals[j.journal]["reconstructed_bytes"] = extended
    for name, jops in by_journal.items():
        if name not in seen:
            n = sum(1 for op in jops if op.outcome == "ok")
            if n:
                t.add("lost", f"{name}: never read back ({n} ok appends)", n)
    appends = {"invoked": len(ops)}
    for outcome in ("ok", "fail", "info", "pending"):
        appends[outcome] = sum(1 for op in ops if op.outcome == outcome)
    appends["acknowledged"] = appends["ok"]
    appends["definite_failures"] = appends["fail"]
    appends["indefinite_failures"] = appends["info"] + appends["pending"]
    fault_counts: dict[str, int] = {}
    for f in faults:
        key = f.kind + (f":{f.params['mode']}" if "mode" in f.params else "")
        fault_counts[key] = fault_counts.get(key, 0) + 1
    rec = recovery_times(faults, ops)
    kills = sum(1 for f in faults if f.kind == "kill-primary")
    recovery: dict[str, float | int | None] = {
        "kills": kills, "recovered": len(rec),
        "p50": round(statistics.median(rec), 3) if rec else None,
        "max": round(max(rec), 3) if rec else None}
    return Report(t.counts, appends, t.examples, fault_counts, recovery, journals)
