from __future__ import annotations

import gzip
import os
import random
import zlib

import cramjam
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from fragment_store import CodecError, compress, compress_chunks, compressor, decompress, decompress_chunks
from protocol import Codec

CODECS = list(Codec)
COMPRESSED = [c for c in Codec if c is not Codec.NONE]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("data", [b"", b"x", b"hello world " * 5000, os.urandom(70000),
                                  b"\0" * (3 << 20)])
def test_round_trip_whole(codec: Codec, data: bytes) -> None:
    z = compress(codec, data)
    assert decompress(codec, z) == data
    assert b"".join(decompress_chunks(codec, compress_chunks(codec, [data]))) == data


@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=200_000),
       in_cuts=st.lists(st.integers(0, 1 << 20), max_size=20),
       out_cuts=st.lists(st.integers(0, 1 << 20), max_size=20),
       out_size=st.integers(1, 1 << 17))
@settings(max_examples=150, deadline=None)
def test_round_trip_any_chunking(codec: Codec, data: bytes, in_cuts: list[int],
                                 out_cuts: list[int], out_size: int) -> None:
    c = compressor(codec)
    z = b"".join(c.compress(piece) for piece in split(data, in_cuts)) + c.flush()
    outs = list(decompress_chunks(codec, split(z, out_cuts), out_size=out_size))
    assert b"".join(outs) == data
    assert all(0 < len(o) <= out_size for o in outs)


def test_output_is_bounded_for_highly_compressible_input() -> None:
    data = b"\0" * (16 << 20)
    for codec in CODECS:
        sizes = [len(o) for o in decompress_chunks(codec, [compress(codec, data)], out_size=1 << 16)]
        assert sum(sizes) == len(data) and max(sizes) <= 1 << 16, codec


def test_formats_are_the_standard_ones() -> None:
    data = b"interoperable " * 1000
    assert gzip.decompress(compress(Codec.GZIP, data)) == data
    assert gzip.decompress(compress(Codec.GZIP_OFFLOAD_DECOMPRESSION, data)) == data
    assert zstandard.ZstdDecompressor().decompressobj().decompress(compress(Codec.ZSTANDARD, data)) == data
    assert bytes(cramjam.snappy.decompress(compress(Codec.SNAPPY, data))) == data
    assert compress(Codec.NONE, data) == data
    # ...and we read what other tools write.
    assert decompress(Codec.GZIP, gzip.compress(data)) == data
    assert decompress(Codec.ZSTANDARD, zstandard.ZstdCompressor().compress(data)) == data
    assert decompress(Codec.SNAPPY, bytes(cramjam.snappy.compress(data))) == data


@given(st.lists(st.binary(max_size=5000), min_size=1, max_size=6))
@settings(max_examples=50, deadline=None)
def test_multi_member_gzip_and_multi_frame_zstd(parts: list[bytes]) -> None:
    assert decompress(Codec.GZIP, b"".join(gzip.compress(p) for p in parts)) == b"".join(parts)
    zc = zstandard.ZstdCompressor()
    assert decompress(Codec.ZSTANDARD, b"".join(zc.compress(p) for p in parts)) == b"".join(parts)
    assert decompress(Codec.SNAPPY, b"".join(bytes(cramjam.snappy.compress(p)) for p in parts)) == \
        b"".join(parts)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_corruption_is_a_codec_error(codec: Codec) -> None:
    data = random.Random(7).randbytes(1000) + b"abc" * 10000
    z = compress(codec, data)
    for bad in (z[:-1], z[: len(z) // 2], z + b"junk", z + b"\0", b"not compressed at all"):
        with pytest.raises(CodecError):
            decompress(codec, bad)
    flipped = bytearray(z)
    flipped[len(z) // 2] ^= 0xFF  # in the body, where every format has a checksum
    with pytest.raises(CodecError):
        decompress(codec, bytes(flipped))


@given(codec=st.sampled_from(COMPRESSED), junk=st.binary(max_size=300),
       cuts=st.lists(st.integers(0, 400), max_size=5))
@settings(max_examples=300, deadline=None)
def test_random_bytes_raise_only_codec_error(codec: Codec, junk: bytes, cuts: list[int]) -> None:
    try:
        for _ in decompress_chunks(codec, split(junk, cuts)):
            pass
    except CodecError:
        pass


def test_snappy_skippable_and_reserved_chunks() -> None:
    data = b"snappy " * 100
    z = compress(Codec.SNAPPY, data)
    padding = bytes([0xFE, 3, 0, 0]) + b"pad"
    assert decompress(Codec.SNAPPY, z[:10] + padding + z[10:]) == data
    with pytest.raises(CodecError):
        decompress(Codec.SNAPPY, z[:10] + bytes([0x02, 1, 0, 0, 0]) + z[10:])
    with pytest.raises(CodecError):  # data before the stream identifier
        decompress(Codec.SNAPPY, z[10:])


def test_zlib_errors_do_not_escape() -> None:
    with pytest.raises(CodecError):
        decompress(Codec.GZIP, zlib.compress(b"zlib, not gzip"))
