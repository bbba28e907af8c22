from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fragment_store import InvalidFragmentKey, fragment_key, parse_key
from fragment_store.keys import EXTENSION, PARSED_EXTENSIONS, fragment_name
from protocol import EMPTY_SUM, Codec, Fragment, ValidationError

SUM = hashlib.sha1(b"x").hexdigest()


def frag(begin: int = 0, end: int = 10, codec: Codec = Codec.NONE, postfix: str = "",
         journal: str = "a/journal") -> Fragment:
    return Fragment(journal=journal, begin=begin, end=end, sum=SUM, codec=codec, path_postfix=postfix)


def test_key_layout_and_extensions() -> None:
    assert fragment_key(frag(0x10, 0x2000)) == \
        f"a/journal/0000000000000010-0000000000002000-{SUM}.raw"
    assert fragment_key(frag(codec=Codec.GZIP)).endswith(".gz")
    assert fragment_key(frag(codec=Codec.ZSTANDARD)).endswith(".zst")
    assert fragment_key(frag(codec=Codec.SNAPPY)).endswith(".sz")
    assert fragment_key(frag(codec=Codec.GZIP_OFFLOAD_DECOMPRESSION)).endswith(SUM)
    assert fragment_key(frag(postfix="date=2024-01-01/hour=03")) == \
        f"a/journal/date=2024-01-01/hour=03/{fragment_name(frag())}"
    assert set(EXTENSION) == set(Codec)


@pytest.mark.parametrize("ext,codec", [
    (".raw", Codec.NONE), (".RAW", Codec.NONE), (".gz", Codec.GZIP), (".GZIP", Codec.GZIP),
    (".gzip", Codec.GZIP), (".zst", Codec.ZSTANDARD), (".ZStandard", Codec.ZSTANDARD),
    (".sz", Codec.SNAPPY), (".Snappy", Codec.SNAPPY), (".gzod", Codec.GZIP_OFFLOAD_DECOMPRESSION),
    (".GZOD", Codec.GZIP_OFFLOAD_DECOMPRESSION), ("", Codec.GZIP_OFFLOAD_DECOMPRESSION),
])
def test_parse_accepts_every_extension(ext: str, codec: Codec) -> None:
    f = parse_key("a/journal", f"a/journal/0000000000000000-000000000000000a-{SUM}{ext}",
                  store_url="file:///s/", mod_time=7)
    assert f == Fragment(journal="a/journal", begin=0, end=10, sum=SUM, codec=codec,
                         backing_store="file:///s/", mod_time=7)


@pytest.mark.parametrize("key", [
    "a/journal/README.md",
    "a/journal/.quire-tmp-0123",
    f"b/journal/0000000000000000-000000000000000a-{SUM}.raw",            # another journal
    f"a/journalx/0000000000000000-000000000000000a-{SUM}.raw",           # prefix sibling
    f"a/journal/0000000000000000-000000000000000a-{SUM}.lz4",            # unknown codec
    f"a/journal/000000000000000-000000000000000a-{SUM}.raw",             # 15 hex digits
    f"a/journal/0000000000000000-000000000000000A-{SUM}.raw",            # upper-case hex
    f"a/journal/0000000000000000-000000000000000a-{SUM.upper()}.raw",
    f"a/journal/0000000000000000-000000000000000a-{SUM[:-1]}.raw",
    f"a/journal/000000000000000a-0000000000000000-{SUM}.raw",            # end < begin
    f"a/journal/000000000000000a-000000000000000a-{EMPTY_SUM}.raw",      # empty
    f"a/journal/0000000000000000-000000000000000a-{SUM}.raw.tmp",
    f"a/journal/../x/0000000000000000-000000000000000a-{SUM}.raw",       # unclean postfix
    f"a/journal//0000000000000000-000000000000000a-{SUM}.raw",
    f"a/journal/.hidden/0000000000000000-000000000000000a-{SUM}.raw",
    "a/journal/",
])
def test_parse_rejects_foreign_names(key: str) -> None:
    with pytest.raises(InvalidFragmentKey) as info:
        parse_key("a/journal", key)
    assert isinstance(info.value, ValidationError)


def test_fragment_key_validates() -> None:
    with pytest.raises(ValidationError):
        fragment_key(Fragment(journal="../x", end=1, sum=SUM))
    with pytest.raises(ValidationError):
        fragment_key(frag(postfix="../escape"))
    with pytest.raises(ValidationError):
        fragment_key(frag(postfix=".quire"))
    with pytest.raises(ValidationError):
        fragment_key(frag(begin=5, end=4))


fragments = st.builds(
    Fragment,
    journal=st.sampled_from(["a/journal", "logs/eu/clicks", "j123", "ünï/cödé"]),
    begin=st.integers(0, (1 << 63) - 2),
    end=st.just(0),
    sum=st.binary(min_size=20, max_size=20).map(bytes.hex),
    codec=st.sampled_from(list(Codec)),
    path_postfix=st.sampled_from(["", "date=2024-01-01", "date=2024-01-01/hour=23", "p%20q"]),
).flatmap(lambda f: st.integers(f.begin + 1, (1 << 63) - 1).map(
    lambda end: Fragment(journal=f.journal, begin=f.begin, end=end, sum=f.sum, codec=f.codec,
                         path_postfix=f.path_postfix)))


@given(fragments)
@settings(max_examples=300, deadline=None)
def test_key_round_trip(f: Fragment) -> None:
    assert parse_key(f.journal, fragment_key(f)) == f


@given(st.lists(st.tuples(st.integers(0, 1 << 62), st.integers(1, 1 << 40)), min_size=2, max_size=30))
@settings(max_examples=200, deadline=None)
def test_listing_order_is_offset_order(spans: list[tuple[int, int]]) -> None:
    frags = [frag(b, b + n, codec=Codec.GZIP) for b, n in spans]
    by_key = sorted(frags, key=fragment_key)
    by_offset = sorted(frags, key=lambda f: (f.begin, f.end))
    assert [(f.begin, f.end) for f in by_key] == [(f.begin, f.end) for f in by_offset]


def test_parsed_extensions_cover_written_ones() -> None:
    for codec, ext in EXTENSION.items():
        assert PARSED_EXTENSIONS[ext] is codec
