"""The Redis keys of the fragment index, shared by the roles that read or write them.

Written by the index workers (workers/index.py), read by coordinators
(coordinator/index_watch.py) and the live dashboard (dashboards/state.py); one home so
the three never disagree on a name. Layer 2: names and encodings only, no IO.

    quire:index:<journal>      JSON list of Fragment: the journal's covering set
    quire:index-updates        pub/sub channel; message = journal name
    quire:index-refreshed      hash journal -> unix time of the last refresh
    quire:index-enqueued       hash journal -> unix time a refresh was last enqueued
    quire:journal-stats        hash journal -> JSON StoreStats over all its stores
    quire:index-digests        hash journal -> "<digest> <unix time>": what was last published
                               (workers only: an unchanged journal is not published again)
"""

from __future__ import annotations

import msgspec

from .stats import StoreStats

__all__ = ["DIGESTS_KEY", "ENQUEUED_KEY", "INDEX_CHANNEL", "INDEX_KEY_PREFIX", "REFRESHED_KEY", "STATS_KEY", "WATERMARKS_KEY",
           "decode_stats", "encode_stats"]

INDEX_CHANNEL = "quire:index-updates"
INDEX_KEY_PREFIX = "quire:index:"
REFRESHED_KEY = "quire:index-refreshed"
ENQUEUED_KEY = "quire:index-enqueued"
STATS_KEY = "quire:journal-stats"
DIGESTS_KEY = "quire:index-digests"
"""Hash journal -> "<digest> <unix time>": the digest of the covering set, labels, stores
and stats the index refresh last published (and when), written in the index's own
transaction; a refresh finding the same digest only stamps `quire:index-refreshed`."""
WATERMARKS_KEY = "quire:watermarks"
"""Hash journal -> persisted watermark (unix seconds), raised by the index refresh
(workers/watermark.py); read by `quire journals list --stats` and the dashboard."""


def encode_stats(stats: StoreStats) -> bytes:
    return msgspec.json.encode(stats._asdict())


def decode_stats(raw: bytes | str) -> StoreStats:
    """A stats entry as written by `encode_stats`; raises ValueError naming what is wrong."""
    try:
        fields = msgspec.json.decode(raw, type=dict[str, int])
        return StoreStats(**{f: fields[f] for f in StoreStats._fields})
    except (msgspec.DecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed journal stats {raw!r:.80}: {exc}") from None
