"""The recovery log: every committed write batch of a shard, in a normal quire journal.

Record framing: `u32 big-endian length | msgpack Record`. A record is either a write
batch (`ops`) or a fence. The log's registers carry the current writer's token under
`shard-author`; every batch is appended with `check_registers: shard-author=<token>`,
so once a newer primary has fenced the log (a fence record appended with
`union_registers: shard-author=<its token>`, which replaces ours), any append of ours
is refused with REGISTER_MISMATCH: a zombie primary cannot write (Gazette's recoverylog
fencing, done with journal registers).

Replay applies every batch record in log order regardless of author: anything in the
log was appended while its author held the fence, so it is committed state. A log whose
head is below the offset a store (or snapshot) was built through has lost committed
batches: replay refuses it (RecoveryLogRegressed) rather than serve state the log can no
longer rebuild and append new batches over offsets the store already reflects.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import msgspec

from protocol import LabelSet, parse_selector
from protocol.errors import QuireError, RegisterMismatch, ShardFenced
from quire.client import Client

from .store import Op

__all__ = ["AUTHOR", "LogWriter", "Record", "RecordReader", "RecoveryLogRegressed", "encode_record",
           "fence", "replay"]

AUTHOR = "shard-author"
_LEN = struct.Struct(">I")


class Record(msgspec.Struct, array_like=True):
    author: str
    ops: list[tuple[bytes, bytes | None]] = []
    fence: bool = False


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)


def encode_record(record: Record) -> bytes:
    body = _encoder.encode(record)
    return _LEN.pack(len(body)) + body


class RecordReader:
    """Feed log bytes (with their offsets); get back whole records with their end offsets."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        """Offset of the first byte not yet consumed into a whole record."""
        self._buf = bytearray()

    def feed(self, offset: int, data: bytes) -> list[tuple[Record, int]]:
        if offset != self.offset + len(self._buf):
            raise ValueError(f"recovery log read jumped: at {offset}, expected "
                             f"{self.offset + len(self._buf)} (content lost from every store?)")
        self._buf += data
        out: list[tuple[Record, int]] = []
        pos = 0
        while len(self._buf) - pos >= 4:
            (size,) = _LEN.unpack_from(self._buf, pos)
            if len(self._buf) - pos - 4 < size:
                break
            record = _decoder.decode(memoryview(self._buf)[pos + 4:pos + 4 + size])
            pos += 4 + size
            out.append((record, self.offset + pos))
        del self._buf[:pos]
        self.offset += pos
        return out


async def fence(client: Client, journal: str, author: str) -> int:
    """Take the log over: append a fence record setting the author register. Returns the
    log's end offset after it (replay up to here to hold every committed batch)."""
    result = await client.append(journal, encode_record(Record(author=author, fence=True)),
                                 union_registers=LabelSet.of({AUTHOR: author}))
    return result.end


class LogWriter:
    """Appends batches under the fence; REGISTER_MISMATCH becomes ShardFenced."""

    def __init__(self, client: Client, journal: str, author: str) -> None:
        self.client = client
        self.journal = journal
        self.author = author
        self._check = parse_selector(f"{AUTHOR}={author}")

    async def append(self, ops: list[Op]) -> int:
        """Append one batch; returns the log offset after it."""
        data = encode_record(Record(author=self.author, ops=ops))
        try:
            result = await self.client.append(self.journal, data, check_registers=self._check)
        except RegisterMismatch as exc:
            raise ShardFenced(f"recovery log fenced by a newer primary: {exc.message}",
                              journal=self.journal) from exc
        return result.end


class RecoveryLogRegressed(QuireError):
    """The recovery log ends before the offset the local store or snapshot was built
    through: committed batches are gone from the log (seen under `quire chaos` when a
    broker lost acknowledged appends). The shard fails rather than go on from a state its
    log cannot rebuild."""

    def __init__(self, journal: str, begin: int, end: int) -> None:
        super().__init__(f"recovery log {journal} ends at {end}, below offset {begin} that the "
                         f"store was built through: committed batches were lost from the log")
        self.journal, self.begin, self.end = journal, begin, end


async def replay(client: Client, journal: str, begin: int, end: int,
                 apply: Callable[[list[Op], int], None],
                 progress: Callable[[int], None] | None = None) -> int:
    """Apply every batch record in [begin, end) in order; returns the bytes replayed.
    Raises RecoveryLogRegressed if `end` (the log's head) is below `begin`."""
    if end < begin:
        raise RecoveryLogRegressed(journal, begin, end)
    if end == begin:
        return 0
    reader = RecordReader(begin)
    total = 0
    async with client.read(journal, begin, block=True, end_offset=end) as chunks:
        async for offset, data in chunks:
            total += len(data)
            for record, record_end in reader.feed(offset, data):
                if not record.fence:
                    apply(record.ops, record_end)
            if progress is not None:
                progress(len(data))
            if offset + len(data) >= end:
                break
    if reader.offset != end:
        raise ValueError(f"recovery log replay ended at {reader.offset}, expected {end}")
    return total
