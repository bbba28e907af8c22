"""Why a job's next window still waits on a journal, and whether to roll it — pure: no
etcd, Redis or clock (workers/jobs_roll.py gathers the facts and acts).

A window ending at `T` (plus the job's `delay`) completes once every journal's persisted
watermark reaches `needed = T + delay`: the first pulse mark at or after `needed`,
`(t, H)`, must lie in the store — its persisted-through offset `P` must reach `H`
(workers/watermark.py). Until then the bytes `[P, H)` are either in the primary's open
fragment or in closed fragments the persisters have not stored yet. An open fragment
of a quiet journal without a `flush_interval` never closes by itself, so once the mark
is `roll_after` seconds old the scheduler asks the primary to close it
(`AppendRequest.roll_below = H`: a no-op when the open fragment already begins at or
past `H`). `assess` words each case the way an operator acts on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["JournalWait", "RollRecord", "assess", "hms", "size"]


@dataclass(frozen=True)
class RollRecord:
    """The scheduler's last request to close a journal's open fragment."""

    below: int
    at: float
    done: float = 0.0
    """When the primary answered OK (0: no answer yet, or it failed)."""
    error: str = ""


@dataclass(frozen=True)
class JournalWait:
    journal: str
    needed: float
    """The watermark the next window needs: its end plus the job's delay."""
    mark: tuple[float, int] | None
    """The first pulse mark (t, head) at or after `needed`; None: no pulse since."""
    through: int | None
    """The persisted-through offset P (None: no index refresh has recorded one yet)."""
    since: float = 0.0
    """The time of the latest mark whose head is <= P: the bytes from P on were
    acknowledged after it (0: unknown)."""
    roll: RollRecord | None = None


def hms(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def size(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def assess(w: JournalWait, *, now: float, roll_after: float, retry_after: float,
           pulse_interval: float) -> tuple[str, bool]:
    """(why the window waits on `w.journal`, whether to ask its primary to roll now)."""
    j = w.journal
    if w.mark is None:
        if now - w.needed > 3 * pulse_interval + 10:
            return (f"{j}: no pulse has marked it since {hms(w.needed)}: pulses are not "
                    f"reaching it (is celery beat running, and a worker on queue `pulse`?)",
                    False)
        return f"{j}: waiting for its first pulse after {hms(w.needed)}", False
    t, head = w.mark
    if w.through is None:
        return (f"{j}: no index refresh has listed its fragments yet (is a worker on "
                f"queue `index` running?)", False)
    if w.through >= head:
        return (f"{j}: persisted through {size(w.through)}; waiting for its index refresh "
                f"to raise the watermark", False)
    span = f"[{size(w.through)}, {size(head)})"
    since = f" since {hms(w.since)}" if w.since else ""
    what = f"{j}: bytes {span} acknowledged{since} are not persisted"
    roll = w.roll if w.roll is not None and w.roll.below >= head else None
    if roll is None:
        if now - t >= roll_after:
            return f"{what}: asking its primary to close the open fragment", True
        return (f"{what} yet: the open fragment is closed at {hms(t + roll_after)} "
                f"unless it fills first", False)
    again = now - roll.at >= retry_after
    if roll.error:
        return (f"{what}: asking its primary to close the open fragment failed at "
                f"{hms(roll.at)}: {roll.error}", again)
    if not roll.done:
        return (f"{what}: asked its primary to close the open fragment at {hms(roll.at)}, "
                f"no answer yet (is a worker on queue `jobs` running?)", again)
    return (f"{what}: its primary was asked to close the open fragment and answered at "
            f"{hms(roll.done)}, yet the bytes are not in the store: persist tasks are pending "
            f"or refused (see `quire doctor`, `quire journals list --stats`)", again)
