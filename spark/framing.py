"""Executor side: read one planned `Span` from the store and frame its messages.

`read_span()` yields `MessageBatch`es — column arrays ready to become a pyarrow
RecordBatch (Spark) or a pandas DataFrame (Dask) — following the ownership rule in
`spark.planner`. Framing is vectorized (numpy finds delimiters; Arrow slices values), so
there is no per-message Python work on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quire.protocol import Fragment, QuireError

from .planner import Span

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

BATCH_BYTES = 4 << 20
"""Raw bytes gathered before framing a batch."""
DELIMITER = 0x0A


class ReadPastExhausted(QuireError):
    """A message is still open after every fragment a span may read past its end."""


@dataclass
class MessageBatch:
    """Messages of one span: `values` (a pyarrow binary array over the decompressed
    bytes, zero-copy, each value still ending in its delimiter; `strip_delimiters`
    removes it), their journal `offsets` (int64 numpy array), and the key of the
    fragment each message starts in (`fragments`, a pyarrow string array)."""

    journal: str
    offsets: Any
    values: Any
    fragments: Any

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True)
class StoreRef:
    """Where and how executors read fragments (picklable; the store client is not)."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)
    """Keywords for fragment_store.open_store (S3 endpoint, credentials, ...)."""
    verify: bool = False
    """Check the SHA-1 of every fragment read whole (lengths are always checked)."""

    def open(self, url: str = "") -> Any:
        from fragment_store import open_store  # cached per URL + options, per process

        return open_store(url or self.url, **(self.options if not url or url == self.url else {}))


READ_PAST_CHUNK = 64 << 10
"""Decompressed chunk size when reading past a span's end (usually to one newline)."""


def fragment_chunks(fragment: Fragment, offset: int, ref: StoreRef,
                    read_past: bool = False) -> Iterator[bytes]:
    """Raw (decompressed) content of `fragment` from journal `offset` to its end.

    Reading past a span's end usually needs a few bytes of the next fragment: decompress
    it in small chunks rather than fragment_store's default 1 MiB."""
    from fragment_store import read_fragment

    store = ref.open(fragment.backing_store)
    if not read_past or fragment.codec.value == "none" or offset != fragment.begin:
        return read_fragment(store, fragment, offset, verify=ref.verify)
    from fragment_store.codecs import decompress_chunks
    from fragment_store.keys import fragment_key

    return decompress_chunks(fragment.codec, store.get(fragment_key(fragment)),
                             out_size=READ_PAST_CHUNK)


def chain_chunks(span: Span, ref: StoreRef) -> Iterator[tuple[int, bytes, int]]:
    """(absolute offset, raw chunk, index into span.chain) from span.begin onward,
    through the chain, until the caller stops iterating."""
    pos = span.begin
    for i, frag in enumerate(span.chain):
        if frag.end <= pos:
            continue
        if frag.begin > pos:
            return
        it = fragment_chunks(frag, pos, ref, read_past=frag.begin >= span.end)
        try:
            for chunk in it:
                if chunk:
                    yield pos, chunk, i
                    pos += len(chunk)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()


def read_raw(span: Span, ref: StoreRef, keys: list[str] | None = None
             ) -> Iterator[tuple[int, bytes, str]]:
    """`raw` framing: exactly the bytes [begin, end) as (offset, chunk, fragment key)."""
    keys = keys or chain_keys(span)
    gen = chain_chunks(span, ref)
    try:
        for off, chunk, i in gen:
            if off >= span.end:
                break
            if off + len(chunk) > span.end:
                chunk = chunk[:span.end - off]
            yield off, chunk, keys[i]
    finally:
        gen.close()


def chain_keys(span: Span) -> list[str]:
    from fragment_store.keys import fragment_key

    return [fragment_key(f) for f in span.chain]


def read_span(span: Span, ref: StoreRef, *, framing: str = "jsonl",
              batch_bytes: int = BATCH_BYTES) -> Iterator[MessageBatch]:
    """Framed messages owned by `span` (see spark.planner for the rule)."""
    import numpy as np
    import pyarrow as pa

    keys = chain_keys(span)
    key_array = pa.array(keys, pa.string())
    begins = np.array([f.begin for f in span.chain], dtype=np.int64)

    if framing == "raw":
        for off, chunk, key in read_raw(span, ref, keys):
            yield MessageBatch(span.journal, np.array([off], dtype=np.int64),
                               pa.array([chunk], pa.binary()), pa.array([key], pa.string()))
        return

    skipping = not span.first
    carry = b""  # the incomplete message at the end of what was framed so far
    pending: list[bytes] = []  # chunks read since
    pending_len = 0
    carry_off = span.begin  # absolute offset of carry[0]
    done = False

    def frame(final: bool) -> MessageBatch | None:
        """Frame the complete messages of carry + pending (and the tail, if `final`)."""
        nonlocal carry, carry_off, pending_len, skipping, done
        data = b"".join([carry, *pending]) if carry else b"".join(pending)
        pending.clear()
        pending_len = 0
        nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == DELIMITER)
        cut = 0
        if skipping:
            if not len(nl):
                carry_off += len(data)
                carry = b""
                return None
            cut = int(nl[0]) + 1
            nl = nl[1:]
            skipping = False
        ends = nl + 1  # exclusive ends, delimiter included, of complete messages
        if final and (int(ends[-1]) if len(ends) else cut) < len(data):
            # Contiguous content ended without a delimiter: the tail is a message.
            data += bytes([DELIMITER])
            ends = np.append(ends, len(data))
        # Message k starts at starts[k] = cut, ends[0], ends[1], ...; it is owned if it
        # starts before span.stop.
        owned = int(np.searchsorted(ends, span.stop - carry_off, side="left")) + 1
        if cut >= span.stop - carry_off:
            owned = 0
        owned = min(owned, len(ends))
        consumed = int(ends[owned - 1]) if owned else cut
        if final or carry_off + consumed >= span.stop:
            done = True
        out = None
        if owned:
            width = np.int32 if len(data) < (1 << 31) else np.int64
            bounds = np.empty(owned + 1, dtype=width)
            bounds[0] = cut
            bounds[1:] = ends[:owned]
            values = pa.Array.from_buffers(pa.binary() if width is np.int32 else pa.large_binary(),
                                           owned, [None, pa.py_buffer(bounds), pa.py_buffer(data)])
            abs_starts = bounds[:-1].astype(np.int64) + carry_off
            if abs_starts[-1] < span.chain[0].end:
                keys_col = pa.repeat(pa.scalar(keys[0], pa.string()), owned)
            else:
                which = np.searchsorted(begins, abs_starts, side="right") - 1
                keys_col = key_array.take(pa.array(which))
            out = MessageBatch(span.journal, abs_starts, values, keys_col)
        carry = data[consumed:]
        carry_off += consumed
        return out

    gen = chain_chunks(span, ref)
    try:
        for _, chunk, _ in gen:
            pending.append(chunk)
            pending_len += len(chunk)
            # Frame at batch size, and after every chunk once past the span's end so
            # read-past stops at the first delimiter.
            if (pending_len >= batch_bytes
                    or carry_off + len(carry) + pending_len >= span.stop):
                batch = frame(False)
                if batch is not None:
                    yield batch
                if done:
                    return
        if carry or pending:
            batch = frame(span.chain_complete)
            if batch is not None:
                yield batch
        if carry and not skipping and not done:
            raise ReadPastExhausted(
                f"journal {span.journal}: the message at offset {carry_off} is still open "
                f"after {len(span.chain)} fragments; raise the readPastFragments option")
    finally:
        gen.close()


def strip_delimiters(values: pa.Array) -> pa.Array:
    """Values without their trailing delimiter (every framed value has one)."""
    import pyarrow.compute as pc

    return pc.binary_slice(values, 0, -1)
