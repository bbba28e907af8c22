"""Storage accounting of a journal in one store: what it costs and what it covers."""

from __future__ import annotations

from typing import NamedTuple



class StoreStats(NamedTuple):
    fragments: int
    stored_bytes: int
    """Bytes as stored (after compression)."""
    oldest: int
    """Unix seconds of the oldest fragment's mod time (0 if none)."""
    newest: int
    begin: int
    """Lowest offset covered (0 if none)."""
    end: int
    """Highest offset covered (0 if none)."""


def add(a: StoreStats, b: StoreStats) -> StoreStats:
    """The stats of two stores (or parts) together."""
    if not a.fragments:
        return b
    if not b.fragments:
        return a
    return StoreStats(a.fragments + b.fragments, a.stored_bytes + b.stored_bytes,
                      min(a.oldest, b.oldest), max(a.newest, b.newest),
                      min(a.begin, b.begin), max(a.end, b.end))


EMPTY = StoreStats(0, 0, 0, 0, 0, 0)
