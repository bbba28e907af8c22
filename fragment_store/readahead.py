"""Reading a sequence of fragments from stores, each proven, the next ones proven ahead.

`read_verified` proves a whole fragment before its first byte, so a reader that walks a
journal fragment after fragment would otherwise alternate: prove N (fetch, decompress,
SHA-1), hand N on, prove N+1, ... `ReadAhead` proves fragment N+1 on a worker thread
while the caller consumes N (hashlib, zlib/zstd, file reads and writes all release the
GIL): with a free core the proof of the next fragment hides behind the use of this one.

The guarantee is unchanged — each fragment's chunks are handed out only once
`read_verified` returned for it, i.e. after its proof passed (or after a good copy was
found, the rotten one quarantined and mended); a fragment with no good copy raises its
`FragmentCorrupt` (or whatever its read raised) when the caller reaches it, after every
byte of the fragments before it, and before any of its own.

**Memory bound**: at most `depth` fragments are proven (or being proven) ahead of the
one being consumed, so at most `depth + 1` fragments' content is held, each bounded as
`read_verified` bounds it (the first `spill_bytes` in memory, the rest in an unnamed temp
file): `(depth + 1) * spill_bytes` plus the chunks in flight. The default depth is
`READ_AHEAD` (QUIRE_VERIFY_READ_AHEAD, default 1; `0` reads one fragment after another
on the caller's thread, as before).

Unverified reads (`unverified_reads_risk_corruption=True`) are streams, not proofs: they
are read one after another on the caller's thread, with no read-ahead.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from protocol import Fragment

from .stores.base import FragmentStore
from .verified import read_verified

__all__ = ["READ_AHEAD", "ReadAhead", "read_fragments"]

READ_AHEAD = int(os.environ.get("QUIRE_VERIFY_READ_AHEAD", "") or 1)
"""Fragments proven ahead of the one being consumed (QUIRE_VERIFY_READ_AHEAD; 0 = none)."""

Item = Fragment | tuple[Fragment, int | None]
"""A fragment (read from its begin), or (fragment, offset inside it)."""


class ReadAhead:
    """Iterate `(fragment, chunks)` pairs in order: each `chunks` is the proven content of
    the fragment from its offset on, as `read_verified(fragment, offset, **kw)` returns it.

    Moving to the next pair closes the previous `chunks` (like itertools.groupby): use
    each pair's chunks before taking the next. Up to `depth` fragments after the current
    one are proven meanwhile on one worker thread. `close()` (or the end of iteration, or
    leaving a `with` block) releases whatever was read ahead and stops the worker.
    `in_flight` is how many fragments are proven or being proven ahead right now."""

    def __init__(self, items: Iterable[Item], *, depth: int = READ_AHEAD, **kw: Any) -> None:
        if depth < 0:
            raise ValueError(f"read-ahead depth (QUIRE_VERIFY_READ_AHEAD) must be >= 0, not {depth}")
        self.depth = depth
        self._items = iter(items)
        self._kw = kw
        self._pending: deque[tuple[Fragment, Future[Iterator[bytes]]]] = deque()
        self._current: Iterator[bytes] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="quire-read-ahead") \
            if depth > 0 and not kw.get("unverified_reads_risk_corruption") else None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _read(self, item: Item) -> Iterator[bytes]:
        fragment, offset = item if isinstance(item, tuple) else (item, None)
        return read_verified(fragment, offset, **self._kw)

    def _submit(self) -> bool:
        """Start proving the next item on the worker; False when there is none."""
        item = next(self._items, None)
        if item is None:
            return False
        fragment = item[0] if isinstance(item, tuple) else item
        assert self._pool is not None
        self._pending.append((fragment, self._pool.submit(self._read, item)))
        return True

    def __iter__(self) -> Iterator[tuple[Fragment, Iterator[bytes]]]:
        try:
            while True:
                self._close_current()
                if self._pool is None:  # no read-ahead: on this thread, one at a time
                    item = next(self._items, None)
                    if item is None:
                        return
                    fragment = item[0] if isinstance(item, tuple) else item
                    self._current = self._read(item)
                    yield fragment, self._current
                    continue
                # Keep the current one (the head) and `depth` after it submitted.
                while len(self._pending) < self.depth + 1 and self._submit():
                    pass
                if not self._pending:
                    return
                fragment, future = self._pending[0]
                chunks = future.result()  # its proof passed (or this raises its error)
                self._pending.popleft()
                self._current = chunks
                # The head left the queue: the next `depth` may be proven while it is used.
                while len(self._pending) < self.depth and self._submit():
                    pass
                yield fragment, chunks
        finally:
            self.close()

    def _close_current(self) -> None:
        current, self._current = self._current, None
        close = getattr(current, "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._close_current()
        while self._pending:
            _, future = self._pending.popleft()
            if future.cancel():
                continue
            try:
                chunks = future.result()
            except BaseException:  # noqa: BLE001 - nobody reads this fragment any more
                continue
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # releases its held content and spill file
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_fragments(store: FragmentStore, fragments: Iterable[Item], *, verify: bool = True,
                   depth: int = READ_AHEAD, **kw: Any) -> Iterator[bytes]:
    """The raw content of `fragments` in `store`, one after another, as one stream of
    chunks: proven with read-ahead (`ReadAhead`, `depth`) by default; `verify=False`
    streams them unproven (`unverified_reads_risk_corruption`)."""
    reader = ReadAhead(fragments, depth=depth, store=store,
                       unverified_reads_risk_corruption=not verify, **kw)
    try:
        for _, chunks in reader:
            yield from chunks
    finally:
        reader.close()
