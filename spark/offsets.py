"""Pure micro-batch planning for the streaming source: offset maps in, parts out.

A streaming offset is a `{journal: byte offset}` map (what Spark's checkpoint stores as
JSON). A micro-batch is the batch between two such maps (DESIGN §14): for each journal,
the bytes [start, end). Both ends are *append boundaries* — a write head, or the end of
a fragment (spools roll only between appends) — so with writers that append whole
messages (`quire append`, AppendService, the quire sink) every micro-batch begins and
ends on a message start, and the batch framing rule (spark.planner: a read trusts its
begin; messages starting before its end are read whole) neither loses nor repeats one.

Each journal's range is split into the persisted part — the contiguous run of its
fragment index starting at `start`, planned into store spans exactly as a batch read —
and the tail after it, which executors read from the coordinators (committed bytes
only). No IO here: the stream reader (spark.stream) gathers heads and indexes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol import Fragment, ValidationError, validate_journal_name

from .planner import Span, covering_runs, plan


class OffsetsError(ValidationError):
    """A malformed offsets map (startingOffsets, or a checkpointed offset)."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"option {option!r}", reason)
        self.option = option


@dataclass(frozen=True)
class Tail:
    """Journal bytes [begin, end) read from the coordinators (not yet in the index)."""

    journal: str
    begin: int
    end: int


def parse_offsets(text: str, option: str = "startingOffsets") -> dict[str, int] | str:
    """`earliest`, `latest`, or a JSON object {journal: offset >= 0}."""
    raw = text.strip()
    if raw.lower() in ("earliest", "latest"):
        return raw.lower()
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OffsetsError(option, f"expected earliest, latest or a JSON object "
                                   f"{{\"journal\": offset}}, got {text!r} ({exc.msg})") from None
    return check_offsets(value, option)


def check_offsets(value: object, option: str = "offsets") -> dict[str, int]:
    """Validate an offset map (journal names and non-negative integer offsets)."""
    if not isinstance(value, dict):
        raise OffsetsError(option, f"expected a JSON object {{\"journal\": offset}}, "
                                   f"got {type(value).__name__}")
    out: dict[str, int] = {}
    for journal, offset in value.items():
        try:
            validate_journal_name(journal, option)
        except ValidationError as exc:
            raise OffsetsError(option, exc.reason) from None
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise OffsetsError(option, f"journal {journal!r}: offset must be an integer >= 0, "
                                       f"got {offset!r}")
        out[journal] = offset
    return out


def boundaries(fragments: Sequence[Fragment], start: int, head: int) -> list[int]:
    """Append boundaries in (start, head]: fragment ends, and the head itself."""
    ends = {f.end for f in fragments if start < f.end < head}
    return sorted(ends | ({head} if head > start else set()))


def cap_offsets(start: Mapping[str, int], heads: Mapping[str, int],
                indexes: Mapping[str, Sequence[Fragment]], max_bytes: int) -> dict[str, int]:
    """End offsets for a micro-batch of about `max_bytes` (maxBytesPerTrigger).

    Pending bytes are shared out in proportion to each journal's backlog, and each
    journal ends at the last append boundary within its share. If no journal has a
    boundary within its share (big fragments, or unpersisted tails that are read whole),
    the journal with the largest backlog advances to its first boundary alone: every
    trigger makes progress, and the limit is a soft one, as Kafka's is."""
    pending = {j: h - start.get(j, 0) for j, h in heads.items() if h > start.get(j, 0)}
    total = sum(pending.values())
    out = {j: max(h, start.get(j, 0)) for j, h in heads.items()}
    if total <= max_bytes:
        return out
    bounds = {j: boundaries(indexes.get(j, ()), start.get(j, 0), heads[j]) for j in pending}
    advanced = False
    for journal, backlog in pending.items():
        begin = start.get(journal, 0)
        share = backlog * max_bytes // total
        within = [b for b in bounds[journal] if b <= begin + share]
        out[journal] = within[-1] if within else begin
        advanced = advanced or bool(within)
    if not advanced:
        first = min(pending, key=lambda j: (-pending[j], j))
        out[first] = bounds[first][0]
    return out


def plan_journal(journal: str, fragments: Sequence[Fragment], start: int, end: int, *,
                 tail: bool = True, **plan_kwargs: object) -> tuple[list[Span], Tail | None]:
    """Store spans for the persisted run at `start`, and the tail to read from the
    coordinators (None when `tail` is False: a store-only stream plans every run)."""
    if end <= start:
        return [], None
    frags = [f for f in fragments if f.journal == journal]
    if not tail:
        return plan(frags, begin=start, end=end, **plan_kwargs), None  # type: ignore[arg-type]
    runs, _ = covering_runs(frags, start, end)
    # The store serves [start, run end) only if its first run holds `start`: a hole at
    # `start` may be a fragment still being persisted, which the coordinators have.
    if not runs or runs[0][0][0] != start:
        return [], Tail(journal, start, end)
    persisted_end = runs[0][-1][1]
    spans = plan(frags, begin=start, end=persisted_end, **plan_kwargs)  # type: ignore[arg-type]
    return spans, (Tail(journal, persisted_end, end) if persisted_end < end else None)
