"""The spool's health: what a coordinator does when its spool disk fills up or fails.

A write that could not be made durable is never acknowledged (DESIGN.md §15); this
module decides what the member says and does about it. One `SpoolHealth` per process
(on its DiskFiles, so every Replica and Pipeline reaches it), in one of three states:

* **ok** — appends are admitted;
* **full** — a spool write failed with ENOSPC (or EDQUOT), the filesystem's free space
  is below the low-water mark, or the member holds more unpersisted content than its
  bound (the store is behind). Appends that would write content, and replicate streams
  of new primaries, are refused with SPOOL_FULL naming the member and the reason; reads,
  rolls and persistence go on, so room returns as persisted fragments are released. The
  state is left by itself once a probe (statvfs, at most every PROBE_INTERVAL) finds
  room again: `resume_free` bytes free and the unpersisted bytes under the bound.
* **failed** — a write failed with any other error (EIO, EROFS, ...). Sticky until the
  process restarts: no silent retry that could reorder or duplicate bytes. Everything
  is refused with SPOOL_FAILED, and the member marks itself exiting with the reason
  (hosting.py), so the allocator moves its journals to healthy members.

Every write error is counted in `quire_spool_write_errors_total{reason}`; the state is
`quire_spool_health` (0 ok, 1 full, 2 failed) and the member key's `health` (shown by
`quire brokers list` and the dashboard).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from protocol import Status
from protocol.logs import get_logger

from . import metrics

__all__ = ["SpoolHealth", "reason_of"]

log = get_logger(__name__)

PROBE_INTERVAL = 0.1
"""Seconds between two statvfs probes (and unpersisted-byte sums) of the admission check."""
RESUME_FREE = 1 << 20
"""Free bytes a full spool filesystem needs again before appends resume (at least; the
low-water mark when it is higher)."""

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_REASONS = {errno.ENOSPC: "enospc", errno.EDQUOT: "edquot", errno.EIO: "eio",
            errno.EROFS: "erofs"}


def reason_of(exc: OSError) -> str:
    """The metric label of a write error: enospc, edquot, eio, erofs or other."""
    return _REASONS.get(exc.errno or 0, "other")


class SpoolHealth:
    OK, FULL, FAILED = "ok", "full", "failed"

    def __init__(self, root: str | Path, member: str, *, low_water: int = 0,
                 max_unpersisted: int = 0, unpersisted: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.member = member
        self.low_water = low_water
        """Refuse appends while the spool filesystem has fewer free bytes (0: off)."""
        self.max_unpersisted = max_unpersisted
        """Refuse appends while this member holds more unpersisted bytes (0: off)."""
        self.unpersisted = unpersisted
        self.resume_free = max(low_water, RESUME_FREE)
        self.state = self.OK
        self.reason = ""
        self.on_change: list[Callable[[SpoolHealth], None]] = []
        self._clock = clock
        self._probed = float("-inf")
        metrics.SPOOL_HEALTH.set(0)

    # -- what callers ask ----------------------------------------------------------------

    @property
    def ok(self) -> bool:
        return self.state == self.OK

    @property
    def status(self) -> Status:
        return Status.SPOOL_FAILED if self.state == self.FAILED else Status.SPOOL_FULL

    @property
    def summary(self) -> str:
        """The member key's `health`: "" when ok, else "<state>: <reason>"."""
        return "" if self.ok else f"{self.state}: {self.reason}"

    def refusal(self) -> tuple[Status, str] | None:
        """(status, message) to refuse a write with, or None to admit it. Probes the
        filesystem and the unpersisted bytes at most every PROBE_INTERVAL."""
        if self.state == self.FAILED:
            return self.status, self._message()
        now = self._clock()
        if now - self._probed >= PROBE_INTERVAL:
            self._probed = now
            self._probe()
        if self.ok:
            return None
        return self.status, self._message()

    def write_failed(self, exc: OSError, what: str = "") -> tuple[Status, str]:
        """A spool write (or flush) raised `exc`: count it, change state, and return the
        (status, message) the refused write is answered with."""
        label = reason_of(exc)
        metrics.SPOOL_WRITE_ERRORS.labels(label).inc()
        detail = f"{os.strerror(exc.errno) if exc.errno else exc} ({label.upper()})" \
            + (f" writing {what}" if what else "")
        if exc.errno in _FULL_ERRNOS:
            if self.state == self.OK:
                self._set(self.FULL, f"spool filesystem full: {detail}")
        elif self.state != self.FAILED:
            self._set(self.FAILED, f"spool write failed: {detail}")
        return self.status, self._message()

    # -- internals -------------------------------------------------------------------------

    def _message(self) -> str:
        return f"member {self.member}: {self.reason}"

    def _probe(self) -> None:
        try:
            st = os.statvfs(self.root)
            free = st.f_bavail * st.f_frsize
        except OSError:
            return  # (the spool dir may not exist yet: nothing written, nothing to say)
        held = self.unpersisted() if self.unpersisted is not None and self.max_unpersisted else 0
        if self.state == self.OK:
            if self.low_water and free < self.low_water:
                self._set(self.FULL, f"spool filesystem below its low-water mark: {free} bytes "
                                     f"free, low-water {self.low_water}")
            elif self.max_unpersisted and held > self.max_unpersisted:
                self._set(self.FULL, f"{int(held)} bytes not yet persisted, over the bound of "
                                     f"{self.max_unpersisted} (the fragment store is behind)")
        elif free >= self.resume_free and not (self.max_unpersisted and held > self.max_unpersisted):
            self._set(self.OK, "")

    def _set(self, state: str, reason: str) -> None:
        if state == self.state and reason == self.reason:
            return
        self.state, self.reason = state, reason
        metrics.SPOOL_HEALTH.set({self.OK: 0, self.FULL: 1, self.FAILED: 2}[state])
        if state == self.OK:
            log.warning("spool writable again: appends resume", member=self.member)
        else:
            log.error("spool refusing writes", member=self.member, state=state, reason=reason)
        for cb in list(self.on_change):
            cb(self)
