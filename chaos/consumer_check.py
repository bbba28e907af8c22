"""The consumer checker: a count shard's committed state against a model of its input.
Pure (no IO): the runner (chaos/consumer_group.py) reads everything back and calls
`check_consumers`.

What is compared, per shard (the Counts example, consumers/examples/counts.py):

* the shard's **committed state**, rebuilt from nothing but its recovery log: every
  batch record applied in log order, as a new primary's restore does. It holds the
  per-key counts (`c/<key>`) and, in the same batches, the read-through offset of the
  source journal (state and offsets commit atomically);
* the **model**: the source journal read back after the run, cut into lines up to that
  committed offset, one count per JSON line's `key`.

Because the offset commits with the state, the state at offset O must equal the model
of the bytes below O exactly, whether or not the shard caught up with its source: a
message counted twice (reprocessed after a failover whose predecessor's batch did land)
is `overcounted`, one skipped is `undercounted`. A shard that did not reach its
source's head within the bounded wait is reported (`consumer_behind`, liveness), and
checked up to where it got.

Safety counts (each must be 0):
  consumer_mismatches      (shard, key) pairs whose committed count differs from the model
  consumer_overcounted     ... of which the count is above the model
  consumer_undercounted    ... of which it is below
  consumer_dual_primaries  times more than one member was primary of a shard in one etcd
                           snapshot (two PRIMARY status reports, or a PRIMARY report from a
                           member other than the lock holder), polled during the run
  consumer_zombie_commits  batch records in a recovery log written by an author other than
                           the one whose fence precedes them: a fenced (zombie) primary
                           committed, which the log's register check must refuse
  consumer_bad_offsets     a committed read-through offset past the source's final head or
                           not at a message boundary
  consumer_output_mismatches  (shard, key) pairs whose last total published to the output
                           journal differs from the committed count (shards that caught up
                           only: outputs are exactly-once, docs/exactly-once.md, so once a
                           shard is idle its published totals are its state)
  consumer_output_duplicates  a (shard, key, count) line published more than once (counts
                           only grow, so each total is published once)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from consumers.recoverylog import Record
from consumers.store import OFFSET_PREFIX

__all__ = ["CONSUMER_SAFETY_KEYS", "ConsumerReport", "LogState", "PrimaryWatch", "ShardReadback",
           "check_consumers", "model_counts"]

CONSUMER_SAFETY_KEYS = ("consumer_mismatches", "consumer_overcounted", "consumer_undercounted",
                        "consumer_dual_primaries", "consumer_zombie_commits",
                        "consumer_bad_offsets", "consumer_output_mismatches",
                        "consumer_output_duplicates")
_EXAMPLES = 5
_COUNT_PREFIX = b"c/"


class LogState:
    """A recovery log replayed into a dict, record by record (feed it incrementally)."""

    def __init__(self) -> None:
        self.kv: dict[bytes, bytes] = {}
        self.fence_author = ""
        """Author of the last fence record seen ("" before the first)."""
        self.batches = 0
        self.fences = 0
        self.authors: list[str] = []
        """Fence authors in log order (one per primary term)."""
        self.zombie: list[str] = []
        """A line per batch whose author is not the current fence's."""
        self.trail: list[tuple[int, str, dict[bytes, bytes | None]]] = []
        """(log end, author, ops) of every batch, in log order: where a wrong count
        first appeared (`first_divergence`)."""

    def apply(self, record: Record, end: int) -> None:
        if record.fence:
            self.fence_author = record.author
            self.fences += 1
            self.authors.append(record.author)
            return
        self.batches += 1
        if record.author != self.fence_author:
            self.zombie.append(f"batch ending at {end} by {record.author!r} after the fence of "
                               f"{self.fence_author or 'nobody'!r}")
        self.trail.append((end, record.author, dict(record.ops)))
        for k, v in record.ops:
            if v is None:
                self.kv.pop(k, None)
            else:
                self.kv[k] = v

    def counts(self) -> dict[str, int]:
        return {k[len(_COUNT_PREFIX):].decode(): int(v) for k, v in self.kv.items()
                if k.startswith(_COUNT_PREFIX)}

    def offset(self, journal: str) -> int:
        raw = self.kv.get(OFFSET_PREFIX + journal.encode())
        return int(raw) if raw is not None else 0


_json = msgspec.json.Decoder()


def model_counts(data: bytes, begin: int, upto: int) -> tuple[dict[str, int], int]:
    """Counts per `key` of the JSON lines in [begin, upto) of a journal whose bytes from
    `begin` are `data`, and the number of lines counted. Blank lines (a read-back hole is
    filled with newlines) and lines without a string-able `key` count nothing, as in the
    Counts app."""
    out: dict[str, int] = {}
    n = 0
    for line in data[:max(0, upto - begin)].split(b"\n"):
        if not line.strip():
            continue
        try:
            value = _json.decode(line)
            key = str(value["key"])
        except (msgspec.DecodeError, KeyError, TypeError):
            continue
        out[key] = out.get(key, 0) + 1
        n += 1
    return out, n


def first_divergence(log: LogState, source: str, data: bytes, begin: int) -> str:
    """The first batch of the log whose counts disagree with the model at the read-through
    offset it commits, with the batch before it: where a mismatch came from."""
    okey = OFFSET_PREFIX + source.encode()
    ends: list[tuple[int, str]] = []  # (offset after the line, key)
    pos = 0
    for line in data.split(b"\n")[:-1]:
        pos += len(line) + 1
        try:
            ends.append((begin + pos, str(_json.decode(line)["key"])))
        except (msgspec.DecodeError, KeyError, TypeError):
            continue
    prev = ""
    for end, author, ops in log.trail:
        raw = ops.get(okey)
        if raw is None:
            continue
        offset = int(raw)
        model: dict[str, int] = {}
        for at, key in ends:
            if at > offset:
                break
            model[key] = model.get(key, 0) + 1
        for k, v in sorted(ops.items()):
            if not k.startswith(_COUNT_PREFIX) or v is None:
                continue
            key = k[len(_COUNT_PREFIX):].decode()
            if int(v) != model.get(key, 0):
                return (f"first at the batch ending at log offset {end} by {author!r}, through "
                        f"source offset {offset}: {key!r} = {int(v)}, model {model.get(key, 0)}; "
                        f"previous batch: {prev or 'none'}")
        prev = f"log offset {end} by {author!r} through {offset}"
    return ""


@dataclass
class ShardReadback:
    shard: str
    source: str
    source_data: bytes
    """The source journal as read back after the run, from `source_begin`."""
    source_begin: int = 0
    source_error: str = ""
    log: LogState = field(default_factory=LogState)
    log_error: str = ""
    log_head: int = 0


@dataclass
class PrimaryWatch:
    """What polling the consumer keys in etcd saw: feed each snapshot to `observe`."""

    polls: int = 0
    failed_polls: int = 0
    dual: int = 0
    examples: list[str] = field(default_factory=list)
    holders: dict[str, str] = field(default_factory=dict)
    """shard -> last lock holder seen."""
    changes: dict[str, int] = field(default_factory=dict)
    """shard -> times its lock holder changed (a new primary)."""
    _in_dual: set[str] = field(default_factory=set)

    def observe(self, revision: int, locks: dict[str, str],
                primaries: Iterable[tuple[str, str]]) -> None:
        """One consistent snapshot: lock holder per shard, (shard, member) per PRIMARY
        status report. A shard with more than one member among its holder and PRIMARY
        reporters starts a dual-primary episode (counted once until it ends)."""
        self.polls += 1
        who: dict[str, set[str]] = {s: {m} for s, m in locks.items()}
        for shard, member in primaries:
            who.setdefault(shard, set()).add(member)
        now_dual = {s for s, ms in who.items() if len(ms) > 1}
        for s in sorted(now_dual - self._in_dual):
            self.dual += 1
            if len(self.examples) < _EXAMPLES:
                self.examples.append(f"rev {revision}: {s} lock {locks.get(s)} primaries "
                                     f"{sorted(m for sh, m in primaries if sh == s)}")
        self._in_dual = now_dual
        for s, m in locks.items():
            prev = self.holders.get(s)
            if prev is not None and prev != m:
                self.changes[s] = self.changes.get(s, 0) + 1
            self.holders[s] = m


@dataclass
class ConsumerReport:
    counts: dict[str, int]
    examples: dict[str, list[str]]
    shards: dict[str, dict[str, Any]]


def published_totals(data: bytes) -> tuple[dict[tuple[str, str], list[int]], int]:
    """Every total the Counts example published, in journal order, per (shard, key), and
    the number of lines that are no such total."""
    out: dict[tuple[str, str], list[int]] = {}
    bad = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            row = _json.decode(line)
            out.setdefault((str(row["shard"]), str(row["key"])), []).append(int(row["count"]))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            bad += 1
    return out, bad


def check_consumers(shards: Sequence[ShardReadback], watch: PrimaryWatch,
                    output: bytes | None = None) -> ConsumerReport:
    """`output`: the output journal read back (None: outputs are not checked)."""
    counts = {k: 0 for k in CONSUMER_SAFETY_KEYS}
    counts.update(consumer_keys=0, consumer_messages=0, consumer_counted=0, consumer_behind=0,
                  consumer_read_errors=0, consumer_primary_changes=sum(watch.changes.values()),
                  consumer_watch_polls=watch.polls, consumer_outputs_checked=0,
                  consumer_output_garbage=0)
    examples: dict[str, list[str]] = {}
    published, counts["consumer_output_garbage"] = published_totals(output or b"")

    def add(key: str, example: str, n: int = 1) -> None:
        counts[key] = counts.get(key, 0) + n
        ex = examples.setdefault(key, [])
        if len(ex) < _EXAMPLES:
            ex.append(example)

    counts["consumer_dual_primaries"] = watch.dual
    if watch.examples:
        examples["consumer_dual_primaries"] = list(watch.examples)
    per_shard: dict[str, dict[str, Any]] = {}
    for sh in shards:
        for z in sh.log.zombie:
            add("consumer_zombie_commits", f"{sh.shard}: {z}")
        if sh.log_error or sh.source_error:
            add("consumer_read_errors", f"{sh.shard}: {sh.log_error or sh.source_error}")
        committed = sh.log.offset(sh.source)
        head = sh.source_begin + len(sh.source_data)
        state = sh.log.counts()
        info: dict[str, Any] = {"source": sh.source, "committed_offset": committed,
                                "source_head": head, "batches": sh.log.batches,
                                "terms": sh.log.fences, "log_head": sh.log_head}
        per_shard[sh.shard] = info
        if sh.source_error:
            continue  # no model to compare with (reported above)
        if committed > head:
            add("consumer_bad_offsets", f"{sh.shard}: committed offset {committed} of {sh.source} "
                                        f"is past its final head {head}")
            continue
        if committed > sh.source_begin and sh.source_data[committed - sh.source_begin - 1:
                                                         committed - sh.source_begin] != b"\n":
            add("consumer_bad_offsets", f"{sh.shard}: committed offset {committed} of {sh.source} "
                                        f"is not at a message boundary")
        if committed < head:
            add("consumer_behind", f"{sh.shard}: committed through {committed} of {sh.source}, "
                                   f"head {head}")
        model, n = model_counts(sh.source_data, sh.source_begin, committed)
        counts["consumer_messages"] += n
        counts["consumer_counted"] += sum(state.values())
        info.update(messages=n, counted=sum(state.values()))
        before = counts["consumer_mismatches"]
        for key in sorted(set(model) | set(state)):
            counts["consumer_keys"] += 1
            want, got = model.get(key, 0), state.get(key, 0)
            if want == got:
                continue
            add("consumer_mismatches", f"{sh.shard} key {key!r}: committed {got}, model {want} "
                                       f"(input through offset {committed})")
            add("consumer_overcounted" if got > want else "consumer_undercounted",
                f"{sh.shard} key {key!r}: {got - want:+d}")
        if counts["consumer_mismatches"] > before:
            info["first_divergence"] = first_divergence(sh.log, sh.source, sh.source_data,
                                                        sh.source_begin)
        if output is None:
            continue
        for (shard, key), totals in published.items():
            if shard == sh.shard and len(totals) != len(set(totals)):
                dup = sorted({n for n in totals if totals.count(n) > 1})
                add("consumer_output_duplicates", f"{shard} key {key!r}: totals {dup} published "
                                                  f"more than once")
        if committed < head or sh.log_error:
            continue  # not idle: its last transaction's outputs may still be in flight
        for key in sorted(set(state) | {k for s_, k in published if s_ == sh.shard}):
            counts["consumer_outputs_checked"] += 1
            last = published.get((sh.shard, key), [None])[-1]
            if last != state.get(key):
                add("consumer_output_mismatches", f"{sh.shard} key {key!r}: last published total "
                                                  f"{last}, committed {state.get(key)}")
    return ConsumerReport(counts, examples, per_shard)
