"""Messages on journals: JSON-lines framing and key -> journal mapping.

Brokers see only bytes; messages are the client's business (architecture-overview.rst,
"Journals and topics"). A *topic* is a set of journals selected by labels (e.g.
`topic=clicks`), each journal one *partition*.

Framing: one JSON value per line (`application/x-ndjson`). A read may end in the middle
of a message; `LineFramer` keeps that partial tail and completes it with the next read,
so only whole messages come out, each with the journal offset of its first byte.

Mapping: `Mapper` sends a message key to one journal of the selected set by rendezvous
(highest-random-weight) hashing, so adding a partition moves only the keys that now
prefer it, and every writer with the same set agrees without coordination.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from protocol import Flag, LabelSelector, parse_selector
from protocol.errors import QuireError, Unavailable

if TYPE_CHECKING:
    from .client import Client

CONTENT_TYPE = "application/x-ndjson"
MAX_MESSAGE = 64 << 20
"""A partial message larger than this is not a message but a framing error."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class FramingError(QuireError):
    """Content that is not a sequence of JSON lines (or a line over the size limit)."""


def encode(value: Any) -> bytes:
    """One message: compact JSON plus the newline that frames it."""
    data = _encoder.encode(value)
    # JSON never contains a raw newline (it is escaped inside strings), so a line is a
    # message; the check guards pre-encoded values passed as msgspec.Raw.
    if b"\n" in data:
        raise FramingError("encoded message contains a newline")
    return data + b"\n"


def encode_many(values: Iterable[Any]) -> bytes:
    return b"".join(encode(v) for v in values)


def decode(line: bytes | memoryview) -> Any:
    try:
        return _decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise FramingError(f"not a JSON message: {exc}") from None


class LineFramer:
    """Feed (offset, bytes) as read from a journal; get back whole lines with offsets."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.max_message = max_message
        self._tail = bytearray()
        self._tail_offset = -1
        """Offset of the tail's first byte (or of the next byte when the tail is empty)."""
        self.dropped = 0
        """Bytes of partial messages discarded because the stream jumped past them."""

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message held back."""
        return len(self._tail)

    @property
    def next_offset(self) -> int:
        """Where the next whole message starts (resume reading here after a restart)."""
        return self._tail_offset

    def feed(self, offset: int, data: bytes | memoryview) -> list[tuple[int, bytes]]:
        """Whole lines completed by this chunk (a list: the state moves on at once)."""
        expected = self._tail_offset + len(self._tail)
        if self._tail_offset >= 0 and offset != expected:
            # An offset jump (content removed from every store) or an unrelated chunk:
            # the held-back bytes can never be completed.
            self.dropped += len(self._tail)
            self._tail.clear()
        if not self._tail:
            self._tail_offset = offset
        self._tail += data
        start = 0
        buf = self._tail
        out: list[tuple[int, bytes]] = []
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            out.append((self._tail_offset + start, bytes(buf[start:end + 1])))
            start = end + 1
        del buf[:start]
        self._tail_offset += start
        if len(buf) > self.max_message:
            raise FramingError(f"message at offset {self._tail_offset} exceeds "
                               f"{self.max_message} bytes without a newline")
        return out

    def feed_json(self, offset: int, data: bytes | memoryview) -> list[tuple[int, Any]]:
        return [(at, decode(line)) for at, line in self.feed(offset, data) if line.strip()]


async def read_messages(chunks: AsyncIterable[tuple[int, bytes]], *, decode_json: bool = True,
                        max_message: int = MAX_MESSAGE) -> AsyncIterator[tuple[int, Any]]:
    """Whole messages (decoded, or raw lines) with offsets, from a journal Reader."""
    framer = LineFramer(max_message)
    async for offset, data in chunks:
        lines = framer.feed_json(offset, data) if decode_json else framer.feed(offset, data)
        for item in lines:
            yield item


# -- mapping ------------------------------------------------------------------------------

def _weight(key: bytes, journal: str) -> bytes:
    return hashlib.blake2b(key + b"\x00" + journal.encode(), digest_size=8).digest()


def rendezvous(key: bytes | str, journals: Iterable[str]) -> str:
    """The journal with the highest hash of (key, journal)."""
    raw = key.encode() if isinstance(key, str) else bytes(key)
    best: tuple[bytes, str] | None = None
    for journal in journals:
        candidate = (_weight(raw, journal), journal)
        if best is None or candidate > best:
            best = candidate
    if best is None:
        raise LookupError("no journals to map to")
    return best[1]


class NoJournals(QuireError):
    """The selector matched no writable journal."""


class Mapper:
    """Map message keys to the journals (partitions) a label selector picks (a topic)."""

    def __init__(self, selector: LabelSelector | str, client: Client, *,
                 refresh_interval: float = 30.0) -> None:
        self.selector = parse_selector(selector) if isinstance(selector, str) else selector
        self.client = client
        self.refresh_interval = refresh_interval
        self.journals: tuple[str, ...] = ()
        self._refreshed_at = float("-inf")

    async def refresh(self) -> tuple[str, ...]:
        entries = await self.client.list_journals(self.selector)
        self.journals = tuple(sorted(e.spec.name for e in entries if e.spec.flags != Flag.READ_ONLY))
        self._refreshed_at = time.monotonic()
        return self.journals

    def map_cached(self, key: bytes | str) -> str:
        if not self.journals:
            raise NoJournals(f"no writable journal matches {self.selector}")
        return rendezvous(key, self.journals)

    async def map(self, key: bytes | str) -> str:
        """The journal for `key`, refreshing the journal set when it is stale or empty."""
        if not self.journals or time.monotonic() - self._refreshed_at > self.refresh_interval:
            try:
                await self.refresh()
            except Unavailable:
                # A known set keeps writers (and AppendService's spill) going while the
                # cluster is unreachable; with none known there is nothing to map to.
                if not self.journals:
                    raise
        return self.map_cached(key)
