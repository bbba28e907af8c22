"""Pure read planning: a journal's fragment index in, input partitions (spans) out.

No IO, no Spark, no Dask: the data source and the Dask reader both call `plan()` and
hand each `Span` to `spark.framing.read_span()` on an executor.

Ownership of messages (delimiter-framed reads, `jsonl` / `lines`)
------------------------------------------------------------------
A read covers journal offsets [read_begin, read_end). It is cut into spans
[begin, end) — one per fragment, pieces of a large fragment, or runs of small ones.
A message starting at offset `s` belongs to exactly one span:

* the span with `first=True` whose `begin == s` — the read's begin (the requested
  `begin`, or the journal's first available offset) and the first offset after a gap in
  the index are *trusted* message starts; otherwise
* the span that holds byte `s - 1`, the delimiter that ends the previous message, i.e.
  the span with `begin < s <= end`;

and in both cases only if `s < read_end`. So a span that is not `first` discards the
bytes through the first delimiter at or after its `begin` (a partial message, or a
whole one that its left neighbour already read because it starts exactly at `begin`),
and every span reads past its `end` — into the next fragments of `chain` — to finish
the last message it owns. Nobody has to look *back* into the previous fragment, which
for a compressed fragment would mean decompressing all of it: this is Hadoop's
LineRecordReader rule, restated over journal offsets. `Span.stop` is the exclusive
bound on the starts a span owns (`end + 1` inside the read, `read_end` for the span
that ends the read).

A message ends at its delimiter, or at the end of contiguous content (journal end or a
gap in the index): such a tail is yielded as it is. `raw` reads ignore all of this and
yield exactly the bytes [begin, end) of each span.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protocol import Fragment, ValidationError

DEFAULT_MAX_SPAN_BYTES = 128 << 20
"""Fragments longer than this (uncompressed) are split into pieces."""
DEFAULT_READ_PAST_FRAGMENTS = 64
"""How many fragments after its end a span may read into to finish a message."""


@dataclass(frozen=True)
class Span:
    """One input partition: journal bytes [begin, end), plus how to read past the end."""

    journal: str
    begin: int
    end: int
    stop: int
    """Exclusive upper bound of the message starts this span owns."""
    first: bool
    """`begin` is a trusted message start (the read's begin, or just after a gap)."""
    chain: tuple[Fragment, ...]
    """The fragment holding `begin`, then its contiguous successors (for read-past)."""
    chain_complete: bool
    """`chain` runs to the end of contiguous content (so running out of it is not an error)."""

    @property
    def length(self) -> int:
        return self.end - self.begin

    @property
    def fragment(self) -> Fragment:
        """The fragment holding `begin`."""
        return self.chain[0]


def covering_runs(fragments: Iterable[Fragment], begin: int = 0,
                  end: int | None = None) -> tuple[list[list[tuple[int, int, Fragment]]],
                                                   list[Fragment]]:
    """Effective [lo, hi) ranges of a covering set, clipped to [begin, end) and grouped
    into runs of contiguous content, and the fragments kept (ends strictly increasing).

    Overlapping fragments (a covering set may hold two that overlap, each with content
    past the other's begin) are trimmed so every offset is read from exactly one
    fragment: the earlier one, read to its end. Fragments wholly covered by another are
    dropped."""
    ordered = sorted(fragments, key=lambda f: (f.begin, -f.end))
    runs: list[list[tuple[int, int, Fragment]]] = []
    kept: list[Fragment] = []
    pos = None  # end of the previous effective range
    for frag in ordered:
        lo = frag.begin if pos is None else max(frag.begin, pos)
        hi = frag.end
        if hi <= lo:
            continue  # empty, or wholly covered by what came before
        kept.append(frag)
        pos = hi
        lo, hi = max(lo, begin), hi if end is None else min(hi, end)
        if hi <= lo:
            continue
        if not runs or runs[-1][-1][1] != lo:
            runs.append([])
        runs[-1].append((lo, hi, frag))
    return runs, kept


def _chain(kept: Sequence[Fragment], ends: Sequence[int], lo: int, hi: int,
           read_past: int) -> tuple[tuple[Fragment, ...], bool]:
    """The fragment holding `lo`, its contiguous successors through `hi`, then at most
    `read_past` more; and whether that reaches the end of contiguous content."""
    i = bisect.bisect_right(ends, lo)
    out: list[Fragment] = []
    extra = 0
    pos = lo
    while i < len(kept):
        frag = kept[i]
        if frag.begin > pos:
            return tuple(out), True  # a gap: contiguous content ends here
        if frag.begin >= hi:
            if extra == read_past:
                return tuple(out), False
            extra += 1
        out.append(frag)
        pos = frag.end
        i += 1
    return tuple(out), True


def plan(fragments: Iterable[Fragment], *, begin: int = 0, end: int | None = None,
         max_span_bytes: int = DEFAULT_MAX_SPAN_BYTES, min_span_bytes: int = 0,
         split_compressed: bool = False,
         read_past_fragments: int = DEFAULT_READ_PAST_FRAGMENTS) -> list[Span]:
    """Spans of one journal's read [begin, end) over its covering set.

    One span per fragment by default. A fragment longer than `max_span_bytes` is split
    into equal pieces (only uncompressed ones, which the store serves by ranged reads,
    unless `split_compressed`: a piece of a compressed fragment is read by decompressing
    and discarding everything before it). Adjacent small fragments are merged into one
    span while the span stays within `min_span_bytes`.
    """
    if begin < 0:
        raise ValidationError("begin", f"{begin} must be >= 0")
    if end is not None and end < begin:
        raise ValidationError("end", f"{end} must be >= begin ({begin})")
    if max_span_bytes <= 0:
        raise ValidationError("maxSpanBytes", f"{max_span_bytes} must be > 0")
    if read_past_fragments < 0:
        raise ValidationError("readPastFragments", f"{read_past_fragments} must be >= 0")
    frags = [f for f in fragments if f.end > f.begin]
    if not frags:
        return []
    journals = {f.journal for f in frags}
    if len(journals) != 1:
        raise ValidationError("fragments", f"plan() takes one journal, got {sorted(journals)}")
    runs, kept = covering_runs(frags, begin, end)
    if not runs:
        return []
    read_end = runs[-1][-1][1]

    pieces: list[tuple[int, int, bool]] = []  # (lo, hi, first)
    for run in runs:
        for j, (lo, hi, frag) in enumerate(run):
            splittable = split_compressed or frag.codec.value == "none"
            n = -(-(hi - lo) // max_span_bytes) if splittable else 1
            step = -(-(hi - lo) // n)
            for a in range(lo, hi, step):
                b = min(a + step, hi)
                first = j == 0 and a == lo
                if (n == 1 and min_span_bytes > 0 and not first and pieces
                        and pieces[-1][1] == a and b - pieces[-1][0] <= min_span_bytes):
                    pieces[-1] = (pieces[-1][0], b, pieces[-1][2])
                else:
                    pieces.append((a, b, first))

    journal = frags[0].journal
    ends = [f.end for f in kept]
    spans: list[Span] = []
    for lo, hi, first in pieces:
        chain, complete = _chain(kept, ends, lo, hi, read_past_fragments)
        stop = read_end if hi >= read_end else hi + 1
        spans.append(Span(journal=journal, begin=lo, end=hi, stop=stop, first=first,
                          chain=chain, chain_complete=complete))
    return spans


def plan_many(indexes: dict[str, Sequence[Fragment]], **kwargs: object) -> list[Span]:
    """Spans of several journals (sorted by journal, then offset)."""
    out: list[Span] = []
    for journal in sorted(indexes):
        out.extend(plan(indexes[journal], **kwargs))  # type: ignore[arg-type]
    return out
