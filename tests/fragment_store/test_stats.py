"""Storage accounting over both stores (a temp directory and the real S3 server)."""

from __future__ import annotations

import hashlib

from fragment_store import FragmentStore, persist_fragment
from fragment_store.persist import store_stats
from fragment_store.stats import EMPTY
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


def test_one_listing_gives_the_fragments_and_the_stats(store: FragmentStore) -> None:
    """The index refresh lists a store once for both (#49): the same objects as
    `list_fragments` and `store_stats` each count, foreign ones skipped by both."""
    from fragment_store import list_fragments, list_fragments_stats

    put(store, "acct/b", 0, b"x" * 40)
    put(store, "acct/b", 40, b"y" * 60)
    put(store, "acct/b", 0, b"x" * 10)
    put(store, "acct/bc", 0, b"z" * 1000)
    store.put("acct/b/not-a-fragment", b"?")
    fragments, stats = list_fragments_stats(store, "acct/b")
    assert fragments == list_fragments(store, "acct/b")
    assert stats == store_stats(store, "acct/b")
    assert stats.fragments == len(fragments) == 3
    assert list_fragments_stats(store, "acct/none") == ([], EMPTY)
