"""persist / read / list / manifest over both stores."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random

import pytest

from fragment_store import (
    ChecksumMismatch,
    CoverSet,
    FragmentNotFound,
    FragmentStore,
    fragment_key,
    fragment_url,
    list_fragments,
    manifest_key,
    persist_fragment,
    read_fragment,
    read_manifest,
    write_manifest,
)
from protocol import Codec, Fragment, LabelSet, ValidationError

J = "logs/clicks"


def make(content: bytes, begin: int = 0, codec: Codec = Codec.GZIP, postfix: str = "") -> Fragment:
    return Fragment(journal=J, begin=begin, end=begin + len(content),
                    sum=hashlib.sha1(content).hexdigest(), codec=codec, path_postfix=postfix)


def content(n: int, seed: int = 1) -> bytes:
    rnd = random.Random(seed)
    return b"".join(b"%d,%s\n" % (i, rnd.randbytes(8).hex().encode()) for i in range(n))


def chunked(data: bytes, size: int = 4096) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("codec", list(Codec))
def test_persist_then_read(store: FragmentStore, codec: Codec) -> None:
    data = content(5000)
    frag = make(data, begin=1000, codec=codec)
    done = persist_fragment(store, frag, chunked(data))
    assert done.backing_store == store.url and done.mod_time > 0
    assert (done.begin, done.end, done.sum, done.codec) == (frag.begin, frag.end, frag.sum, codec)
    assert store.exists(fragment_key(frag))
    assert b"".join(read_fragment(store, done)) == data
    for offset in (1000, 1001, 1000 + len(data) // 2, done.end - 1, done.end):
        assert b"".join(read_fragment(store, done, offset)) == data[offset - 1000:]
    with pytest.raises(ValidationError):
        read_fragment(store, done, 999)


def test_persist_accepts_bytes_and_files(store: FragmentStore) -> None:
    data = content(100)
    persist_fragment(store, make(data, codec=Codec.ZSTANDARD), data)
    other = content(100, seed=2)
    persist_fragment(store, make(other, begin=len(data), codec=Codec.SNAPPY), io.BytesIO(other))
    assert [(f.begin, f.codec) for f in list_fragments(store, J)] == \
        [(0, Codec.ZSTANDARD), (len(data), Codec.SNAPPY)]


def test_persist_is_idempotent(store: FragmentStore) -> None:
    data = content(200)
    frag = make(data)
    first = persist_fragment(store, frag, chunked(data))

    def must_not_be_read():  # type: ignore[no-untyped-def]
        raise AssertionError("re-uploaded an existing fragment")
        yield b""

    again = persist_fragment(store, frag, must_not_be_read())
    assert again == first
    assert len(list(store.list(J + "/"))) == 1


@pytest.mark.parametrize("bad", ["sum", "short", "long"])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP])
def test_checksum_mismatch_leaves_nothing(store: FragmentStore, bad: str, codec: Codec) -> None:
    data = content(3000)
    frag = make(data, codec=codec)
    sent = {"sum": data[:-1] + b"X", "short": data[:-1], "long": data + b"!"}[bad]
    with pytest.raises(ChecksumMismatch):
        persist_fragment(store, frag, chunked(sent))
    assert not store.exists(fragment_key(frag))
    assert list(store.list()) == []


def test_large_fragment_multipart(store: FragmentStore) -> None:
    data = random.Random(3).randbytes(12 << 20)  # incompressible: > one 5 MiB part
    frag = make(data, codec=Codec.GZIP)
    persist_fragment(store, frag, chunked(data, 1 << 20))
    assert b"".join(read_fragment(store, frag)) == data
    bad = bytearray(data)
    bad[-1] ^= 1
    frag2 = make(data, begin=len(data), codec=Codec.ZSTANDARD)
    with pytest.raises(ChecksumMismatch):
        persist_fragment(store, frag2, chunked(bytes(bad), 1 << 20))
    assert not store.exists(fragment_key(frag2))


def test_empty_fragment_is_never_persisted(store: FragmentStore) -> None:
    with pytest.raises(ValidationError):
        persist_fragment(store, Fragment(journal=J, begin=5, end=5), b"")


def test_read_detects_corrupt_objects(store: FragmentStore) -> None:
    data = content(500)
    frag = make(data, codec=Codec.GZIP)
    key = fragment_key(frag)
    store.put(key, b"garbage, not gzip")
    # The codec's refusal is reported as the copy failing its proof (FragmentCorrupt is a
    # ChecksumMismatch); without a good copy the object is copied aside and kept.
    with pytest.raises(ChecksumMismatch):
        b"".join(read_fragment(store, frag))
    assert store.read_all(key) == b"garbage, not gzip"
    assert store.read_all(".quire/quarantine/" + key) == b"garbage, not gzip"
    raw = make(data, codec=Codec.NONE)
    store.put(fragment_key(raw), data[:-3])
    with pytest.raises(ChecksumMismatch):
        b"".join(read_fragment(store, raw))
    store.put(fragment_key(raw), data[:-1] + b"?")
    with pytest.raises(ChecksumMismatch):
        b"".join(read_fragment(store, raw))
    assert b"".join(read_fragment(store, raw, verify=False)) == data[:-1] + b"?"
    with pytest.raises(FragmentNotFound):
        read_fragment(store, make(b"absent"))


def test_list_fragments_skips_foreign_names(store: FragmentStore, caplog: pytest.LogCaptureFixture) -> None:
    a, b = content(10, 1), content(10, 2)
    fa = persist_fragment(store, make(a), a)
    fb = persist_fragment(store, make(b, begin=len(a), postfix="date=2024-01-01"), b)
    store.put(J + "/README.txt", b"hi")
    store.put(J + "/0000000000000000-zzzz.raw", b"hi")
    store.put("logs/clicks-other/x", b"hi")
    with caplog.at_level(logging.WARNING, logger="fragment_store.persist"):
        listed = list_fragments(store, J)
    assert listed == [fa, fb]
    assert all(f.backing_store == store.url and f.mod_time > 0 for f in listed)
    assert sum("skipping foreign object" in r.getMessage() for r in caplog.records) == 2
    assert list_fragments(store, "no/such/journal") == []


def test_fragment_url(store: FragmentStore) -> None:
    import urllib.request

    data = content(50)
    frag = persist_fragment(store, make(data, codec=Codec.NONE), data)
    with urllib.request.urlopen(fragment_url(store, frag, 30), timeout=10) as resp:
        assert resp.read() == data


def test_manifest_round_trip(store: FragmentStore) -> None:
    with pytest.raises(FragmentNotFound):
        read_manifest(store, J)
    frags = []
    for i in range(3):
        data = content(20, seed=i)
        begin = frags[-1].end if frags else 0
        frags.append(persist_fragment(store, make(data, begin=begin), data))
    written = write_manifest(store, J, list_fragments(store, J), now=123.0)
    got = read_manifest(store, J)
    assert got == written and got.updated == 123.0
    assert got.end_offset == frags[-1].end
    assert got.cover_set() == CoverSet(frags)
    assert manifest_key(J) == ".quire/index/logs/clicks/manifest.json"
    assert store.exists(manifest_key(J))
    # The manifest never shows up as a fragment of the journal.
    assert list_fragments(store, J) == frags
    store.put(manifest_key(J), b"{broken")
    with pytest.raises(ValidationError):
        read_manifest(store, J)


def test_manifest_labels_and_manifests_written_before_them(store: FragmentStore) -> None:
    data = content(20)
    frag = persist_fragment(store, make(data), data)
    labels = LabelSet.of({"app": "clicks", "tier": "gold"})
    written = write_manifest(store, J, [frag], now=1.0, labels=labels)
    assert read_manifest(store, J) == written and written.labels == labels
    # A manifest from before labels existed (no "labels" field) still reads: no labels.
    old = json.loads(store.read_all(manifest_key(J)))
    del old["labels"]
    store.put(manifest_key(J), json.dumps(old).encode())
    got = read_manifest(store, J)
    assert got.labels == LabelSet() and got.fragments == (frag,)
