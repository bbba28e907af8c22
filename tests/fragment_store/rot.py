"""Planting rot in a real store: one byte of a stored object flipped in place."""

from __future__ import annotations

from fragment_store import FragmentStore

ROT_CODECS = ("none", "gzip", "zstd")
"""The codecs every reader's integrity test covers."""


def flip_byte(store: FragmentStore, key: str, at: int | None = None) -> bytes:
    """Flip one byte (default: the middle one) of the object under `key`, written back
    through the store itself (a file rewritten, an S3 object replaced). Returns the
    rotten object."""
    data = bytearray(store.read_all(key))
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x20
    store.put(key, bytes(data))
    return bytes(data)
