"""Storage accounting of a journal in one store: what it costs and what it covers."""

from __future__ import annotations

from typing import NamedTuple

from .errors import InvalidFragmentKey
from .keys import journal_prefix, parse_key
from .stores import FragmentStore


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


def store_stats(store: FragmentStore, journal: str) -> StoreStats:
    """One listing of the journal's prefix; objects that are not its fragment keys
    are not counted."""
    out = EMPTY
    for info in store.list(journal_prefix(journal)):
        try:
            f = parse_key(journal, info.key)
        except InvalidFragmentKey:
            continue
        out = add(out, StoreStats(1, info.size, info.mod_time, info.mod_time, f.begin, f.end))
    return out
