"""Executor side: a journal's unpersisted tail [begin, end), read from the coordinators.

The bytes come from `quire.client` (a Read RPC: committed content only, proxied or
handed off to the store by the coordinator for anything persisted since the driver
listed the index) and are framed like a store span whose begin is trusted: `begin` and
`end` are append boundaries (spark.offsets). Rows carry a null `fragment` (the bytes
were not read from a persisted fragment). An offset jump (content removed below a
store's retention) starts a new message at the offset the coordinator resumed from.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .framing import DELIMITER, MessageBatch
from .offsets import Tail


def frame_bytes(journal: str, offset: int, data: bytes, framing: str,
                final: bool) -> tuple[MessageBatch | None, int]:
    """Messages of `data` (starting at journal `offset` on a message start): a batch of
    the complete ones (and of an undelimited tail if `final`), and how many bytes that
    consumed."""
    import numpy as np
    import pyarrow as pa

    if not data:
        return None, 0
    if framing == "raw":
        return (MessageBatch(journal, np.array([offset], dtype=np.int64),
                             pa.array([data], pa.binary()), pa.nulls(1, pa.string())), len(data))
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == DELIMITER) + 1
    if final and (not len(ends) or int(ends[-1]) < len(data)):
        data += bytes([DELIMITER])
        ends = np.append(ends, len(data))
    if not len(ends):
        return None, 0
    large = len(data) >= (1 << 31)
    bounds = np.empty(len(ends) + 1, dtype=np.int64 if large else np.int32)
    bounds[0] = 0
    bounds[1:] = ends
    values = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), len(ends),
                                   [None, pa.py_buffer(bounds), pa.py_buffer(data)])
    starts = bounds[:-1].astype(np.int64) + offset
    consumed = len(data) if final else int(ends[-1])
    return MessageBatch(journal, starts, values, pa.nulls(len(ends), pa.string())), consumed


def read_tail(tail: Tail, brokers: tuple[str, ...], batch_bytes: int,
              framing: str) -> Iterator[MessageBatch]:
    """Framed messages of the tail, in batches of about `batch_bytes`."""
    from quire.client import SyncClient

    client = SyncClient(list(brokers))
    try:
        pending: list[bytes] = []
        pending_len = 0
        pos = tail.begin  # journal offset of pending[0]
        for offset, chunk in client.read(tail.journal, tail.begin, end_offset=tail.end):
            if offset != pos + pending_len:  # an offset jump: flush, restart framing
                batch, _ = frame_bytes(tail.journal, pos, b"".join(pending), framing, True)
                if batch is not None:
                    yield batch
                pending, pending_len, pos = [], 0, offset
            pending.append(chunk)
            pending_len += len(chunk)
            if pending_len >= batch_bytes:
                data = b"".join(pending)
                batch, used = frame_bytes(tail.journal, pos, data, framing, False)
                if batch is not None:
                    yield batch
                pending, pending_len, pos = [data[used:]], len(data) - used, pos + used
        batch, _ = frame_bytes(tail.journal, pos, b"".join(pending), framing, True)
        if batch is not None:
            yield batch
    finally:
        client.close()


def tail_batches(tail: Tail, brokers: tuple[str, ...], schema: Any, framing: str,
                 batch_bytes: int) -> Iterator[Any]:
    """The tail's rows as record batches of `schema` (what executors yield)."""
    from .arrow import to_record_batch

    for batch in read_tail(tail, brokers, batch_bytes, framing):
        if len(batch):
            yield to_record_batch(batch, schema, framing)
