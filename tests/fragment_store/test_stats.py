"""Storage accounting over both stores (a temp directory and the real S3 server)."""

from __future__ import annotations

import hashlib

from fragment_store import FragmentStore, persist_fragment
from fragment_store.stats import EMPTY, store_stats
from protocol import Fragment


def put(store: FragmentStore, journal: str, begin: int, data: bytes) -> Fragment:
    return persist_fragment(store, Fragment(journal=journal, begin=begin, end=begin + len(data),
                                            sum=hashlib.sha1(data).hexdigest(), codec="none"), data)


def test_stats_count_bytes_times_and_offsets(store: FragmentStore) -> None:
    put(store, "acct/a", 100, b"x" * 40)
    put(store, "acct/a", 140, b"y" * 60)
    put(store, "acct/ab", 0, b"z" * 1000)  # a neighbour the name prefixes is not counted
    store.put("acct/a/not-a-fragment", b"?")
    st = store_stats(store, "acct/a")
    assert (st.fragments, st.stored_bytes, st.begin, st.end) == (2, 100, 100, 200)
    assert 0 < st.oldest <= st.newest
    assert store_stats(store, "acct/none") == EMPTY
