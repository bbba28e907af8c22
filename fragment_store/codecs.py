"""Fragment codecs: streaming compression and decompression of fragment content.

| codec        | format                                  | library   |
|--------------|-----------------------------------------|-----------|
| none         | raw bytes                               | —         |
| gzip         | RFC 1952, multi-member on decode        | zlib      |
| zstd         | zstd frames (with checksum), multi-frame  | zstandard |
| snappy       | snappy *framing* format (sNaPpY chunks) | cramjam   |
| gzip-offload | gzip bytes (stored Content-Encoding: gzip) | zlib   |

`compressor(codec)` returns an object with `.compress(chunk) -> bytes` and
`.flush() -> bytes` (which ends the stream). `decompress_chunks(codec, chunks)` is a
generator: iterable of compressed chunks in, raw chunks out, each at most `out_size`
bytes however well the input compressed (a decompression bomb costs one chunk of memory).
Corrupt, truncated or trailing-junk input raises `CodecError`, never another exception.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Protocol

import cramjam
import zstandard

from protocol import Codec

from .errors import CodecError

OUT_SIZE = 1 << 20
"""Default largest raw chunk a decompressor yields."""
GZIP_LEVEL = 6
ZSTD_LEVEL = 3
_SNAPPY_BLOCK = 1 << 16
_SNAPPY_IDENT = b"\xff\x06\x00\x00sNaPpY"


class Compressor(Protocol):
    def compress(self, chunk: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


class _Identity:
    def compress(self, chunk: bytes) -> bytes:
        return bytes(chunk)

    def flush(self) -> bytes:
        return b""


class _Gzip:
    def __init__(self, level: int = GZIP_LEVEL) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, 31)

    def compress(self, chunk: bytes) -> bytes:
        return self._z.compress(chunk)

    def flush(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


class _Zstd:
    def __init__(self, level: int = ZSTD_LEVEL) -> None:
        self._z = zstandard.ZstdCompressor(level=level, write_checksum=True).compressobj()

    def compress(self, chunk: bytes) -> bytes:
        return self._z.compress(chunk)

    def flush(self) -> bytes:
        return self._z.flush()


class _Snappy:
    """Framed snappy; input is cut into 64 KiB blocks (the framing format's maximum)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._started = False

    def _frames(self, data: bytes | bytearray) -> bytes:
        out = bytes(cramjam.snappy.compress(bytes(data)))
        if self._started:  # one stream identifier is enough
            out = out[len(_SNAPPY_IDENT):]
        self._started = True
        return out

    def compress(self, chunk: bytes) -> bytes:
        self._buf += chunk
        whole = len(self._buf) - len(self._buf) % _SNAPPY_BLOCK
        if not whole:
            return b""
        out = self._frames(self._buf[:whole])
        del self._buf[:whole]
        return out

    def flush(self) -> bytes:
        if not self._buf and self._started:
            return b""
        out = self._frames(self._buf)
        self._buf.clear()
        return out


def compressor(codec: Codec | str) -> Compressor:
    """A fresh streaming compressor for `codec`."""
    codec = Codec(codec)
    if codec is Codec.NONE:
        return _Identity()
    if codec in (Codec.GZIP, Codec.GZIP_OFFLOAD_DECOMPRESSION):
        return _Gzip()
    if codec is Codec.ZSTANDARD:
        return _Zstd()
    return _Snappy()


def compress(codec: Codec | str, data: bytes) -> bytes:
    """Compress a whole buffer."""
    c = compressor(codec)
    return c.compress(data) + c.flush()


def compress_chunks(codec: Codec | str, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Stream compression: raw chunks in, compressed chunks out (empty ones dropped)."""
    c = compressor(codec)
    for chunk in chunks:
        out = c.compress(chunk)
        if out:
            yield out
    out = c.flush()
    if out:
        yield out


def decompress(codec: Codec | str, data: bytes) -> bytes:
    """Decompress a whole buffer."""
    return b"".join(decompress_chunks(codec, [data]))


def decompress_chunks(codec: Codec | str, chunks: Iterable[bytes],
                      out_size: int = OUT_SIZE) -> Iterator[bytes]:
    """Stream decompression: compressed chunks in, raw chunks of <= out_size out."""
    codec = Codec(codec)
    if codec is Codec.NONE:
        for chunk in chunks:
            for i in range(0, len(chunk), out_size):
                yield bytes(chunk[i:i + out_size])
    elif codec in (Codec.GZIP, Codec.GZIP_OFFLOAD_DECOMPRESSION):
        yield from _gunzip(chunks, out_size)
    elif codec is Codec.ZSTANDARD:
        yield from _unzstd(chunks, out_size)
    else:
        yield from _unsnappy(chunks, out_size)


def _gunzip(chunks: Iterable[bytes], out_size: int) -> Iterator[bytes]:
    d = None  # the current member's decompressor; None between members
    try:
        for chunk in chunks:
            data = bytes(chunk)
            while True:
                if d is None:
                    if not data:
                        break
                    d = zlib.decompressobj(31)
                out = d.decompress(data, out_size)
                if out:
                    yield out
                if d.eof:
                    # Multi-member: whatever follows a member must be another member.
                    data, d = d.unused_data, None
                else:
                    data = d.unconsumed_tail
                    if not data and not out:
                        break  # needs more input
    except zlib.error as exc:
        raise CodecError(f"corrupt gzip stream: {exc}") from None
    if d is not None:
        raise CodecError("gzip stream is truncated")


_ZSTD_SLICE = 4096
"""Input fed to zstd per call; a zstd block expands at most ~32768x, so this bounds the
output of a single call even for hostile input."""


def _unzstd(chunks: Iterable[bytes], out_size: int) -> Iterator[bytes]:
    dctx = zstandard.ZstdDecompressor()
    d = None  # the current frame's decompressor; None between frames
    try:
        for chunk in chunks:
            view = memoryview(bytes(chunk))
            while view:
                if d is None:
                    d = dctx.decompressobj()
                data, view = view[:_ZSTD_SLICE], view[_ZSTD_SLICE:]
                out = d.decompress(data)
                for i in range(0, len(out), out_size):
                    yield out[i:i + out_size]
                if d.eof:
                    # Multi-frame: what follows a frame must be another frame.
                    rest = d.unused_data
                    d = None
                    if rest:
                        view = memoryview(rest + bytes(view))
    except zstandard.ZstdError as exc:
        raise CodecError(f"corrupt zstd stream: {exc}") from None
    if d is not None:
        raise CodecError("zstd stream is truncated")


def _unsnappy(chunks: Iterable[bytes], out_size: int) -> Iterator[bytes]:
    buf = bytearray()
    started = False
    for chunk in chunks:
        buf += chunk
        pos = 0
        while len(buf) - pos >= 4:
            kind = buf[pos]
            length = int.from_bytes(buf[pos + 1:pos + 4], "little")
            if len(buf) - pos < 4 + length:
                break
            frame = bytes(buf[pos:pos + 4 + length])
            pos += 4 + length
            if not started and kind != 0xFF:
                raise CodecError("snappy stream does not start with its identifier")
            if kind == 0xFF:
                if frame != _SNAPPY_IDENT:
                    raise CodecError("bad snappy stream identifier")
                started = True
            elif kind in (0x00, 0x01):
                try:  # cramjam checks the chunk's masked CRC-32C
                    out = bytes(cramjam.snappy.decompress(_SNAPPY_IDENT + frame))
                except cramjam.DecompressionError as exc:
                    raise CodecError(f"corrupt snappy chunk: {exc}") from None
                for i in range(0, len(out), out_size):
                    yield out[i:i + out_size]
            elif kind <= 0x7F:
                raise CodecError(f"reserved unskippable snappy chunk type {kind:#x}")
            # 0x80..0xfe are skippable padding
        del buf[:pos]
    if buf:
        raise CodecError(f"snappy stream is truncated ({len(buf)} bytes left over)")
