"""The read-ahead sequence reader: fragment N+1 is proven while N is consumed, yet no byte
of a fragment reaches the caller before its proof, and at most `depth` fragments are
held ahead of the one in use."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from fragment_store import (
    FileStore,
    FragmentCorrupt,
    FragmentStore,
    ReadAhead,
    fragment_key,
    persist_fragment,
    read_fragments,
    verify_stored,
)
from fragment_store import verified as verified_mod
from protocol import Codec, Fragment
from tools.services import wait_for

from .rot import ROT_CODECS, flip_byte

J = "logs/ahead"
PROOF_TIMEOUT = 30.0
"""Seconds a read-ahead proof of a few hundred KiB may take on a loaded machine."""


def journal(n: int, codec: str, seed: int = 3) -> tuple[bytes, list[Fragment]]:
    """`n` fragments of ~100-300 KiB of text, back to back from offset 0."""
    rnd = random.Random(seed)
    content, frags, pos = b"", [], 0
    for _ in range(n):
        part = b"".join(b"%d:%s\n" % (pos + i, rnd.randbytes(20).hex().encode())
                        for i in range(rnd.randrange(2000, 6000)))
        frags.append(Fragment(journal=J, begin=pos, end=pos + len(part),
                              sum=hashlib.sha1(part).hexdigest(), codec=Codec(codec)))
        content += part
        pos += len(part)
    return content, frags


def persist(store: FragmentStore, content: bytes, frags: list[Fragment]) -> list[Fragment]:
    return [persist_fragment(store, f, content[f.begin:f.end]) for f in frags]


class CountingStore(FileStore):
    """A real file store that counts the fetches of fragment objects (each proof is one)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.fetched: list[str] = []

    def get(self, key: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        if not key.startswith(".quire/"):
            self.fetched.append(key)
        return super().get(key, offset, length)


def corrupt_count(url: str) -> float:
    return verified_mod.CORRUPT.labels(url)._value.get()  # noqa: SLF001


@pytest.mark.parametrize("depth", [0, 1, 3])
@pytest.mark.parametrize("codec", ROT_CODECS)
def test_sequence_is_read_whole_and_in_order(store: FragmentStore, codec: str, depth: int) -> None:
    content, frags = journal(5, codec)
    frags = persist(store, content, frags)
    assert b"".join(read_fragments(store, frags, depth=depth)) == content
    assert b"".join(read_fragments(store, frags, verify=False)) == content
    # From an offset inside the first fragment.
    items = [(frags[0], 1234), *frags[1:]]
    assert b"".join(read_fragments(store, items, depth=depth)) == content[1234:]


@pytest.mark.parametrize("codec", ROT_CODECS)
def test_rotten_next_fragment_never_reaches_the_caller(tmp_path: Path, codec: str) -> None:
    store = FileStore((tmp_path / "store").as_uri() + "/")
    content, frags = journal(3, codec)
    frags = persist(store, content, frags)
    flip_byte(store, fragment_key(frags[1]))
    before = corrupt_count(store.url)
    got: list[bytes] = []
    reader = ReadAhead(frags, depth=1, store=store, chunk=4096)
    pairs = iter(reader)
    fragment, chunks = next(pairs)
    assert fragment == frags[0]
    got.append(next(chunks))
    # Fragment 1 is proven (and fails) on the worker while fragment 0 is still in use.
    wait_for(lambda: corrupt_count(store.url) == before + 1, timeout=PROOF_TIMEOUT,
             what="the read-ahead to find fragment 1 rotten")
    got.extend(chunks)
    assert b"".join(got) == content[frags[0].begin:frags[0].end]  # N's bytes, all of them
    with pytest.raises(FragmentCorrupt) as err:
        for _, chunks in pairs:
            got.extend(chunks)
    assert b"".join(got) == content[frags[0].begin:frags[0].end]  # and not one of N+1's
    assert err.value.fragment in fragment_key(frags[1])
    assert reader.in_flight == 0
    assert store.exists(verified_mod.quarantine_key(fragment_key(frags[1])))


@pytest.mark.parametrize("codec", ROT_CODECS)
def test_rotten_next_fragment_is_read_from_a_good_copy(tmp_path: Path, codec: str) -> None:
    store = FileStore((tmp_path / "store").as_uri() + "/")
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    content, frags = journal(3, codec)
    frags = persist(store, content, frags)
    persist(backup, content, frags)
    key = fragment_key(frags[1])
    rotten = flip_byte(store, key)
    opened = {store.url: store, backup.url: backup}
    out = b"".join(read_fragments(store, frags, depth=2, stores=[store.url, backup.url],
                                  open_store=opened.__getitem__))
    assert out == content
    assert store.read_all(verified_mod.quarantine_key(key)) == rotten
    assert verify_stored(store, frags[1]) == ""  # mended


@pytest.mark.parametrize("depth", [1, 2])
def test_read_ahead_is_bounded_by_its_depth(tmp_path: Path, depth: int) -> None:
    store = CountingStore((tmp_path / "store").as_uri() + "/")
    content, frags = journal(6, "gzip")
    frags = persist(store, content, frags)
    store.fetched.clear()
    out: list[bytes] = []
    with ReadAhead(frags, depth=depth, store=store, chunk=8192) as reader:
        for n, (fragment, chunks) in enumerate(reader):
            assert fragment == frags[n]
            assert reader.in_flight <= depth
            # Proven: this one and at most `depth` after it, never more.
            assert len(store.fetched) <= n + 1 + depth
            ahead = min(len(frags), n + 1 + depth)
            wait_for(lambda a=ahead: len(store.fetched) >= a, timeout=PROOF_TIMEOUT,
                     what=f"the read-ahead past fragment {n}")
            for chunk in chunks:
                out.append(chunk)
                assert len(store.fetched) <= n + 1 + depth
    assert b"".join(out) == content
    assert store.fetched == [fragment_key(f) for f in frags]  # each proven once, in order


def test_closing_early_releases_what_was_read_ahead(tmp_path: Path) -> None:
    store = CountingStore((tmp_path / "store").as_uri() + "/")
    content, frags = journal(4, "none")
    frags = persist(store, content, frags)
    store.fetched.clear()
    reader = ReadAhead(frags, depth=2, store=store)
    pairs = iter(reader)
    _, chunks = next(pairs)
    wait_for(lambda: len(store.fetched) == 3, timeout=PROOF_TIMEOUT, what="two proven ahead")
    pairs.close()  # the caller stops after its first chunk
    assert reader.in_flight == 0
    assert all(not t.is_alive() for t in reader._pool._threads)  # type: ignore[union-attr]  # noqa: SLF001
    assert len(store.fetched) == 3
    with pytest.raises(StopIteration):
        next(chunks)  # the fragment in use was closed too


def test_negative_depth_is_refused(tmp_path: Path) -> None:
    store = FileStore((tmp_path / "store").as_uri() + "/")
    with pytest.raises(ValueError, match="depth"):
        ReadAhead([], depth=-1, store=store)
