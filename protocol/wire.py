"""Frame codec, sans-IO.

One frame:

    u32 length | u8 kind | u32 header_length | msgpack header | raw payload
    `length` counts every byte after itself (1 + 4 + header_length + payload length).

msgpack is self-delimiting but msgspec decodes whole buffers only, hence the explicit
header length. Limits are checked on the 9-byte prefix, before anything is buffered, so
a hostile length can never make us allocate. `FrameDecoder` is fed bytes and yields
`Frame`s; every malformed input raises `ProtocolError` (or its `FrameTooLarge`) and
nothing else.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import msgspec

from .errors import FrameTooLarge, ProtocolError
from .messages import ALL_MESSAGES, Message

PREFIX = struct.Struct("!IBI")
PREFIX_SIZE = PREFIX.size  # 9
MAX_HEADER = 1 << 20
"""Largest msgpack header (a ListResponse page of specs fits comfortably)."""
MAX_CHUNK = 1 << 20
"""Largest content payload of one frame; bigger content is split into chunks."""
MAX_FRAME = MAX_HEADER + MAX_CHUNK + 5

_KINDS: dict[int, type[Message]] = {cls.KIND: cls for cls in ALL_MESSAGES}
_DECODERS = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in _KINDS.items()}
_ENCODER = msgspec.msgpack.Encoder()


class Frame(msgspec.Struct, frozen=True):
    message: Message
    payload: bytes | memoryview = b""


def encode_frame(message: Message, payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """Buffers to hand to `writelines` (the payload is not copied)."""
    header = _ENCODER.encode(message)
    plen = len(payload)
    if len(header) > MAX_HEADER:
        raise ProtocolError(f"{type(message).__name__} header of {len(header)} bytes exceeds {MAX_HEADER}")
    if plen > MAX_CHUNK:
        raise ProtocolError(f"payload of {plen} bytes exceeds the chunk limit {MAX_CHUNK}")
    prefix = PREFIX.pack(5 + len(header) + plen, message.KIND, len(header))
    return [prefix + header, payload] if plen else [prefix + header]


class FrameTemplate:
    """Frames of one constant message (say, `AppendChunk()`) with any payload: its
    header is encoded once, and each frame costs one prefix pack."""

    __slots__ = ("kind", "header", "_hlen")

    def __init__(self, message: Message) -> None:
        self.kind = message.KIND
        self.header = _ENCODER.encode(message)
        self._hlen = len(self.header)

    def encode(self, payload: bytes | memoryview) -> list[bytes | memoryview]:
        """As encode_frame(message, payload)."""
        plen = len(payload)
        if plen > MAX_CHUNK:
            raise ProtocolError(f"payload of {plen} bytes exceeds the chunk limit {MAX_CHUNK}")
        head = PREFIX.pack(5 + self._hlen + plen, self.kind, self._hlen) + self.header
        return [head, payload] if plen else [head]


def encode_frame_bytes(message: Message, payload: bytes = b"") -> bytes:
    return b"".join(encode_frame(message, payload))


def check_prefix(prefix: bytes | memoryview) -> tuple[int, int, int]:
    """Validate a 9-byte prefix; return (kind, header_length, payload_length)."""
    try:
        length, kind, hlen = PREFIX.unpack(prefix)
    except struct.error:
        raise ProtocolError(f"a frame prefix is {PREFIX_SIZE} bytes, got {len(prefix)}") from None
    return check_fields(length, kind, hlen)


def check_fields(length: int, kind: int, hlen: int) -> tuple[int, int, int]:
    """check_prefix on an already unpacked prefix."""
    if length < 5:
        raise ProtocolError(f"frame length {length} is shorter than its own prefix")
    if length > MAX_FRAME:
        raise FrameTooLarge(f"frame length {length} exceeds the limit {MAX_FRAME}")
    if kind not in _KINDS:
        raise ProtocolError(f"unknown frame kind {kind}")
    if hlen > MAX_HEADER or hlen > length - 5:
        raise ProtocolError(f"header length {hlen} does not fit frame length {length}")
    plen = length - 5 - hlen
    if plen > MAX_CHUNK:
        raise FrameTooLarge(f"payload of {plen} bytes exceeds the chunk limit {MAX_CHUNK}")
    return kind, hlen, plen


def decode_header(kind: int, header: bytes | memoryview) -> Message:
    try:
        return _DECODERS[kind].decode(header)
    except (msgspec.MsgspecError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # msgspec raises UnicodeDecodeError (a ValueError) for invalid UTF-8 in strings.
        raise ProtocolError(f"bad {_KINDS[kind].__name__} header: {exc}") from None


class FrameDecoder:
    """Incremental decoder: `feed()` bytes, iterate `frames()`."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need: tuple[int, int, int] | None = None

    def feed(self, data: bytes | memoryview) -> None:
        self._buf += data
        # Reject a hostile prefix now, even if the caller feeds more before iterating.
        if self._need is None and len(self._buf) >= PREFIX_SIZE:
            self._need = check_prefix(bytes(self._buf[:PREFIX_SIZE]))

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def frames(self) -> Iterator[Frame]:
        while True:
            if self._need is None:
                if len(self._buf) < PREFIX_SIZE:
                    return
                self._need = check_prefix(bytes(self._buf[:PREFIX_SIZE]))
            kind, hlen, plen = self._need
            total = PREFIX_SIZE + hlen + plen
            if len(self._buf) < total:
                return
            message = decode_header(kind, bytes(self._buf[PREFIX_SIZE:PREFIX_SIZE + hlen]))
            payload = bytes(self._buf[PREFIX_SIZE + hlen:total])
            del self._buf[:total]
            self._need = None
            yield Frame(message, payload)
