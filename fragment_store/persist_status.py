"""Persistence status in the workers' Redis: what is not in the store yet, and why.

Shared by the roles that write it and the tools that show it (layer 2: names, msgspec
types and readers over a client the caller gives; no connection of its own):

    quire:persist-backlog    hash journal -> JSON PersistBacklog, written every few seconds
                             by the journal's primary coordinator (coordinator/backlog.py);
                             a field is deleted when the journal's backlog reaches zero
    quire:persist-failures   hash journal -> JSON PersistFailure, written by a persist
                             worker on every failed or refused attempt (workers/persist.py);
                             deleted when a persist of that journal succeeds

Read by `quire journals list --stats`, the live dashboard and `quire doctor`.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

__all__ = ["BACKLOG_KEY", "FAILURES_KEY", "STALE_AFTER", "PersistBacklog", "PersistFailure",
           "decode_backlog", "decode_failure", "parse_backlog", "parse_failures", "read_backlog",
           "read_failures"]

BACKLOG_KEY = "quire:persist-backlog"
FAILURES_KEY = "quire:persist-failures"

STALE_AFTER = 30.0
"""Seconds after which a backlog entry no coordinator refreshed is dropped by readers
(its coordinator died, or the journal moved and its new primary reports no backlog)."""


class PersistBacklog(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes of a journal acknowledged to writers but not yet in its store."""

    bytes: int = 0
    """Closed fragments waiting for a persist worker plus the open fragment's content."""
    fragments: int = 0
    """Closed fragments waiting (the open one not counted)."""
    oldest: float = 0.0
    """Unix time the oldest of those bytes was acknowledged (0: none)."""
    coordinator: str = ""
    """The primary that reported it (`zone#suffix`)."""
    updated: float = 0.0
    """Unix time of the report."""

    def age(self, now: float | None = None) -> float:
        """Seconds since the oldest unpersisted byte was acknowledged (0 without one)."""
        if not self.oldest or not self.bytes:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - self.oldest)


class PersistFailure(msgspec.Struct, frozen=True, kw_only=True):
    """The last failed or refused persist attempt of a journal's fragments."""

    reason: str
    """store_not_allowed, store_unavailable, fetch_failed, checksum, timeout, invalid, other."""
    message: str = ""
    store: str = ""
    count: int = 1
    """Attempts that failed since the journal's last successful persist."""
    first: float = 0.0
    last: float = 0.0
    worker: str = ""


_BACKLOG = msgspec.json.Decoder(PersistBacklog)
_FAILURE = msgspec.json.Decoder(PersistFailure)


def decode_backlog(raw: bytes | str) -> PersistBacklog:
    """One hash value; ValueError naming the problem if it is not a PersistBacklog."""
    try:
        return _BACKLOG.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"malformed persist backlog {raw!r:.80}: {exc}") from None


def decode_failure(raw: bytes | str) -> PersistFailure:
    try:
        return _FAILURE.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"malformed persist failure {raw!r:.80}: {exc}") from None


def _name(key: bytes | str) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else key


def parse_backlog(raw: dict[Any, Any], *, now: float | None = None,
                  stale_after: float = STALE_AFTER) -> dict[str, PersistBacklog]:
    """An HGETALL of BACKLOG_KEY -> journal -> backlog, without stale or malformed entries."""
    now = time.time() if now is None else now
    out: dict[str, PersistBacklog] = {}
    for key, value in raw.items():
        try:
            b = decode_backlog(value)
        except ValueError:
            continue
        if now - b.updated <= stale_after:
            out[_name(key)] = b
    return out


def parse_failures(raw: dict[Any, Any]) -> dict[str, PersistFailure]:
    out: dict[str, PersistFailure] = {}
    for key, value in raw.items():
        try:
            out[_name(key)] = decode_failure(value)
        except ValueError:
            continue
    return out


def read_backlog(client: Any, *, now: float | None = None,
                 stale_after: float = STALE_AFTER) -> dict[str, PersistBacklog]:
    """journal -> its backlog, from a (sync) redis.Redis."""
    return parse_backlog(client.hgetall(BACKLOG_KEY), now=now, stale_after=stale_after)


def read_failures(client: Any) -> dict[str, PersistFailure]:
    """journal -> its last persist failure, from a (sync) redis.Redis."""
    return parse_failures(client.hgetall(FAILURES_KEY))
