"""The persisted watermark of each journal: the time up to which everything the journal
acknowledged is in the fragment store (docs/jobs.md, "The watermark").

* A **mark** `(t, head)` is recorded by each pulse (workers/pulse.py): `t` is taken
  before the zero-byte append is sent and `head` is the write head it answers, so every
  append acknowledged before `t` lies below `head`. Marks live in the Redis sorted set
  `quire:marks:<journal>` (score `t`, member `"<t>:<head>"`), kept for
  `QUIRE_WORKER_MARK_RETENTION` seconds.
* The index refresh (workers/index.py) knows the **persisted-through offset** `P`: the
  end of the store's contiguous coverage from its first fragment. It calls `advance`,
  which sets the watermark to the latest mark whose head is `<= P` (in
  `quire:watermarks`, only ever raised) and exports it as
  `quire_journal_persisted_watermark_seconds{journal}`.
* A window `[T0, T1)` of a journal is the offsets `[B(T0), B(T1))`, where `B(T)` is the
  head of the first mark at or after `T` (0 if no mark is older than `T`): consecutive
  windows tile the journal exactly, and a window holds everything acknowledged before
  `T1` that an earlier window does not.

A journal with no appends keeps its head, so each new pulse's mark is persisted at once
and the watermark moves with the pulses.
"""

from __future__ import annotations

import time

from fragment_store import CoverSet
from fragment_store.index_keys import WATERMARKS_KEY
from protocol.logs import get_logger
from workers import common, jobs_metrics as metrics

__all__ = ["MARKS_PREFIX", "PERSISTED_KEY", "WATERMARKS_KEY", "advance", "boundary",
           "first_mark", "last_mark_through", "persisted_through", "read_persisted",
           "read_watermarks", "record_mark"]

log = get_logger(__name__)

MARKS_PREFIX = "quire:marks:"
PERSISTED_KEY = "quire:persisted-through"

# HSET key field max(old, new): the watermark never goes back, whatever the order in
# which two refreshes of a journal finish.
_RAISE = ("local old = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or '0') "
          "if tonumber(ARGV[2]) > old then redis.call('hset', KEYS[1], ARGV[1], ARGV[2]) "
          "return ARGV[2] end return tostring(old)")


def _retention() -> float:
    return common.worker_settings().mark_retention


def record_mark(journal: str, t: float, head: int) -> None:
    """Record that everything `journal` acknowledged before `t` lies below `head`."""
    r = common.redis_client()
    key = MARKS_PREFIX + journal
    pipe = r.pipeline(transaction=False)
    pipe.zadd(key, {f"{t:.6f}:{head}": t})
    pipe.zremrangebyscore(key, "-inf", f"({t - _retention():.6f}")
    pipe.execute()


def _marks(journal: str, low: float = float("-inf"), high: float = float("inf"),
           limit: int | None = None) -> list[tuple[float, int]]:
    r = common.redis_client()
    lo = "-inf" if low == float("-inf") else f"{low:.6f}"
    hi = "+inf" if high == float("inf") else f"{high:.6f}"
    kwargs = {"start": 0, "num": limit} if limit is not None else {}
    out = []
    for member in r.zrangebyscore(MARKS_PREFIX + journal, lo, hi, **kwargs):
        t, _, head = member.decode().partition(":")
        out.append((float(t), int(head)))
    return out


def persisted_through(cover: CoverSet) -> int:
    """The end of the contiguous coverage from the first stored fragment."""
    reach = cover.begin_offset
    for f in cover:
        if f.begin > reach:
            break
        reach = max(reach, f.end)
    return reach


def advance(journal: str, cover: CoverSet) -> float:
    """Raise `journal`'s watermark to the latest mark persisted through `cover`; the
    watermark (unix seconds, 0 if none yet)."""
    r = common.redis_client()
    through = persisted_through(cover)
    raw = r.hget(WATERMARKS_KEY, journal)
    current = float(raw) if raw else 0.0
    best = current
    for t, head in _marks(journal, low=current):
        if head > through:
            break  # heads never fall as time goes on; later marks are higher still
        best = max(best, t)
    pipe = r.pipeline(transaction=False)
    pipe.hset(PERSISTED_KEY, journal, str(through))
    if best > current:
        pipe.eval(_RAISE, 1, WATERMARKS_KEY, journal, f"{best:.6f}")
    pipe.execute()
    if best:
        metrics.JOURNAL_WATERMARK.labels(journal).set(best)
    return best


def read_watermarks(journals: list[str] | None = None) -> dict[str, float]:
    """journal -> watermark (0.0 for a journal with none yet)."""
    r = common.redis_client()
    if journals is None:
        return {k.decode(): float(v) for k, v in r.hgetall(WATERMARKS_KEY).items()}
    if not journals:
        return {}
    values = r.hmget(WATERMARKS_KEY, journals)
    return {j: float(v) if v else 0.0 for j, v in zip(journals, values, strict=True)}


def first_mark(journal: str, t: float) -> tuple[float, int] | None:
    """The first mark (t, head) of `journal` at or after `t`, if any."""
    after = _marks(journal, low=t, limit=1)
    return after[0] if after else None


def last_mark_through(journal: str, head: int, before: float, scan: int = 200) -> float:
    """The time of the latest mark before `before` whose head is <= `head` (0: none among
    the `scan` latest): every byte from `head` on was acknowledged after it."""
    r = common.redis_client()
    for member in r.zrevrangebyscore(MARKS_PREFIX + journal, f"({before:.6f}", "-inf",
                                     start=0, num=scan):
        t, _, h = member.decode().partition(":")
        if int(h) <= head:
            return float(t)
    return 0.0


def read_persisted(journals: list[str]) -> dict[str, int | None]:
    """journal -> persisted-through offset recorded by its last index refresh (None: no
    refresh has recorded one yet)."""
    if not journals:
        return {}
    values = common.redis_client().hmget(PERSISTED_KEY, journals)
    return {j: int(v) if v is not None else None for j, v in zip(journals, values, strict=True)}


def boundary(journal: str, t: float) -> int | None:
    """B(t): the offset splitting what `journal` acknowledged before `t` from after —
    the head of the first mark at or after `t`, or 0 if no mark is older than `t`.
    None if no mark at or after `t` exists yet."""
    r = common.redis_client()
    key = MARKS_PREFIX + journal
    if not r.zrangebyscore(key, "-inf", f"({t:.6f}", start=0, num=1):
        return 0
    after = _marks(journal, low=t, limit=1)
    return after[0][1] if after else None


def forget(journal: str) -> None:
    """A deleted journal: drop its marks and watermark."""
    r = common.redis_client()
    pipe = r.pipeline(transaction=False)
    pipe.delete(MARKS_PREFIX + journal)
    pipe.hdel(WATERMARKS_KEY, journal)
    pipe.hdel(PERSISTED_KEY, journal)
    pipe.execute()
    try:
        metrics.JOURNAL_WATERMARK.remove(journal)
    except KeyError:
        pass


def lag(journal_watermarks: dict[str, float], now: float | None = None) -> float:
    now = time.time() if now is None else now
    low = min(journal_watermarks.values(), default=0.0)
    return max(0.0, now - low) if low else 0.0
