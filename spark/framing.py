"""Executor side: read one planned `Span` from the store and frame its messages.

`read_span()` yields `MessageBatch`es — column arrays ready to become a pyarrow
RecordBatch (Spark) or a pandas DataFrame (Dask) — following the ownership rule in
`spark.planner`. Framing is vectorized (numpy finds delimiters; Arrow slices values), so
there is no per-message Python work on the hot path.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol import Fragment, QuireError

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
    verify: bool = True
    """Prove every fragment by its SHA-1 before any byte of it is framed; False only from
    the option unverifiedReadsRiskCorruption (a rotten byte then becomes a row)."""
    stores: tuple[str, ...] = ()
    """Other stores with copies (option fallbackStores): a corrupt copy is replaced."""

    def open(self, url: str = "") -> Any:
        from fragment_store import open_store  # cached per URL + options, per process

        url = url or self.url
        same_kind = url.split("://", 1)[0] == self.url.split("://", 1)[0]
        return open_store(url, **(self.options if same_kind else {}))


READ_PAST_CHUNK = 64 << 10
"""Decompressed chunk size when reading past a span's end (usually to one newline)."""


def fragment_chunks(fragment: Fragment, offset: int, ref: StoreRef,
                    read_past: bool = False) -> Iterator[bytes]:
    """Raw (decompressed) content of `fragment` from journal `offset` to its end.

    Proven first (fragment_store.verified: the whole fragment, bounded memory), other
    copies tried in `ref.url` and `ref.stores`. Reading past a span's end usually needs a
    few bytes of the next fragment: it is handed on in small chunks."""
    from fragment_store import read_fragment

    store = ref.open(fragment.backing_store)
    if ref.verify:
        from fragment_store.verified import BATCH_SPILL_BYTES, read_verified

        return read_verified(fragment, offset, store=store, stores=(ref.url, *ref.stores),
                             open_store=ref.open, chunk=READ_PAST_CHUNK if read_past else 1 << 20,
                             cache=True, spill_bytes=BATCH_SPILL_BYTES)
    if not read_past or fragment.codec.value == "none" or offset != fragment.begin:
        return read_fragment(store, fragment, offset, verify=False)
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
    if framing == "raw":
        for off, chunk, key in read_raw(span, ref, keys):
            yield MessageBatch(span.journal, np.array([off], dtype=np.int64),
                               pa.array([chunk], pa.binary()), pa.array([key], pa.string()))
        return

    framer = _Framer(span, keys)
    gen = chain_chunks(span, ref)
    try:
        for _, chunk, _ in gen:
            framer.pending.append(chunk)
            framer.pending_len += len(chunk)
            # Frame at batch size, and after every chunk once past the span's end so
            # read-past stops at the first delimiter.
            if (framer.pending_len >= batch_bytes
                    or framer.carry_off + framer.carry_len + framer.pending_len >= span.stop):
                batch = framer.frame(False)
                if batch is not None:
                    yield batch
                if framer.done:
                    return
        if framer.carry_len or framer.pending:
            batch = framer.frame(span.chain_complete)
            if batch is not None:
                yield batch
        if framer.carry_len and not framer.skipping and not framer.done:
            raise ReadPastExhausted(
                f"journal {span.journal}: the message at offset {framer.carry_off} is still "
                f"open after {len(span.chain)} fragments; raise the readPastFragments option")
    finally:
        gen.close()
        framer.release()


_SCRATCH = threading.local()
"""Per thread: the delimiter mask of a finished span, for the next span (a fresh 4 MiB
array per batch costs more in page faults than the comparison that fills it)."""
SCRATCH_KEEP = 64 << 20
"""Larger masks (a batch holding a huge message) are not kept."""


def _take_mask() -> Any:
    return _SCRATCH.__dict__.pop("mask", None)


def _give_mask(mask: Any) -> None:
    if mask is not None and len(mask) <= SCRATCH_KEEP:
        _SCRATCH.mask = mask


class _Framer:
    """Incremental framing of one span's content: chunks are gathered in `pending` and
    `frame()` cuts the complete messages of carry + pending into a MessageBatch, keeping
    the incomplete last message as the next carry (`carry_len` bytes at `carry_off`)."""

    def __init__(self, span: Span, keys: list[str]) -> None:
        import numpy as np
        import pyarrow as pa

        self.span, self.keys = span, keys
        self.key_array = pa.array(keys, pa.string())
        self.begins = np.array([f.begin for f in span.chain], dtype=np.int64)
        self.skipping = not span.first
        self.done = False
        self.pending: list[bytes] = []  # chunks read since the last frame()
        self.pending_len = 0
        self.carry = b""  # the incomplete message at the end of what was framed so far
        self.carry_off = span.begin  # journal offset of carry[0]
        self.mask = _take_mask()

    @property
    def carry_len(self) -> int:
        return len(self.carry)

    def release(self) -> None:
        """Hand the delimiter mask to the thread's next span."""
        _give_mask(self.mask)
        self.mask = None

    def _delimiters(self, arr: Any) -> Any:
        """Positions of the delimiters in `arr` (the comparison goes to a reused mask)."""
        import numpy as np

        if self.mask is None or len(self.mask) < len(arr):
            self.mask = np.empty(max(len(arr), len(arr) * 5 // 4), dtype=bool)
        mask = self.mask[:len(arr)]
        np.equal(arr, DELIMITER, out=mask)
        return np.flatnonzero(mask)

    def _keep_carry(self, data: bytes, consumed: int) -> None:
        self.carry_off += consumed
        self.carry = data[consumed:]

    def frame(self, final: bool) -> MessageBatch | None:
        """Frame the complete messages of carry + pending (and the tail, if `final`)."""
        import numpy as np
        import pyarrow as pa

        span = self.span
        data = b"".join([self.carry, *self.pending]) if self.carry else b"".join(self.pending)
        self.pending.clear()
        self.pending_len = 0
        nl = self._delimiters(np.frombuffer(data, dtype=np.uint8))
        cut = 0
        if self.skipping:
            if not len(nl):
                self._keep_carry(data, len(data))
                return None
            cut = int(nl[0]) + 1
            nl = nl[1:]
            self.skipping = False
        ends = nl + 1  # exclusive ends, delimiter included, of complete messages
        if final and (int(ends[-1]) if len(ends) else cut) < len(data):
            # Contiguous content ended without a delimiter: the tail is a message.
            data += bytes([DELIMITER])
            ends = np.append(ends, len(data))
        carry_off = self.carry_off
        # Message k starts at starts[k] = cut, ends[0], ends[1], ...; it is owned if it
        # starts before span.stop.
        owned = int(np.searchsorted(ends, span.stop - carry_off, side="left")) + 1
        if cut >= span.stop - carry_off:
            owned = 0
        owned = min(owned, len(ends))
        consumed = int(ends[owned - 1]) if owned else cut
        if final or carry_off + consumed >= span.stop:
            self.done = True
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
                keys_col = repeated(self.keys[0], owned)
            else:
                which = np.searchsorted(self.begins, abs_starts, side="right") - 1
                keys_col = self.key_array.take(pa.array(which))
            out = MessageBatch(span.journal, abs_starts, values, keys_col)
        self._keep_carry(data, consumed)
        return out


REPEAT_CACHE_BYTES = 4 << 20
"""`repeated()` keeps constant columns up to this size, to slice batch after batch."""


def repeated(text: str, n: int, large: bool = False) -> pa.Array:
    """A string array of `n` times `text` (the `journal` and `fragment` columns): a
    zero-copy slice of a cached array when it is small enough, else a fresh one."""
    import pyarrow as pa

    size = 1 << max(n - 1, 0).bit_length()
    if size * max(len(text), 1) > REPEAT_CACHE_BYTES:
        return pa.repeat(pa.scalar(text, pa.large_string() if large else pa.string()), n)
    return _repeated(text, size, large).slice(0, n)


@functools.lru_cache(maxsize=8)
def _repeated(text: str, size: int, large: bool) -> pa.Array:
    import pyarrow as pa

    return pa.repeat(pa.scalar(text, pa.large_string() if large else pa.string()), size)


def strip_delimiters(values: pa.Array) -> pa.Array:
    """Values without their trailing delimiter (every framed value has one)."""
    import pyarrow.compute as pc

    return pc.binary_slice(values, 0, -1)
