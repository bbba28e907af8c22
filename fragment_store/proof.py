"""The proof of a fragment's content: its SHA-1 (the one in its name) and length.

`prove` takes raw content chunks and returns them held (`Proven`) only if they are the
fragment's; `prove_stored` does it for a stored object (fetch, decompress, prove). Also
here: the quarantine of a rotten object, the metrics and the per-process cache of
proven content. `verified.read_verified` builds the reader on these.
"""

from __future__ import annotations

import hashlib
import os
import queue
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import IO

from prometheus_client import Counter

from protocol import Fragment
from protocol.logs import get_logger

from .codecs import decompress_chunks
from .errors import ChecksumMismatch, CodecError, StoreError
from .keys import fragment_key
from .stores.base import READ_CHUNK, FragmentStore

log = get_logger(__name__)

SPILL_BYTES = int(os.environ.get("QUIRE_VERIFY_SPILL_BYTES", "") or 16 << 20)
"""Raw content kept in memory while it is proven; past this it spills to a temp file
(QUIRE_VERIFY_SPILL_BYTES; the memory bound of one verifying read)."""
BATCH_SPILL_BYTES = max(SPILL_BYTES, 64 << 20)
"""The spill bound of batch readers (Spark and Dask tasks): their memory is the engine's
to size, and spilling a 32 MiB fragment to disk costs more than its SHA-1."""
HASH_THREAD_BYTES = 1 << 20
"""Fragments at least this long are hashed and held (or spilled) on a helper thread while
the next chunks are fetched and decompressed (hashlib, zlib/zstd and file writes release
the GIL): on an idle core the proof then costs almost no wall time."""
CACHE_BYTES = int(os.environ.get("QUIRE_VERIFY_CACHE_BYTES", "") or 64 << 20)
"""Proven in-memory content kept per process for the next read of the same fragment
(batch readers; QUIRE_VERIFY_CACHE_BYTES, `0` = none)."""
QUARANTINE_PREFIX = ".quire/quarantine/"
"""Where a corrupt object is moved, under its original key (same store)."""

VERIFIED = Counter("quire_fragment_reads_verified_total",
                   "Fragment copies read from a store and proven by their SHA-1", ["outcome"])
CORRUPT = Counter("quire_fragment_corrupt_total",
                  "Stored fragment copies that failed their proof (SHA-1, length or codec)",
                  ["store"])
QUARANTINED = Counter("quire_fragment_quarantined_total",
                      "Corrupt fragment objects moved under .quire/quarantine/", ["store"])
MENDED = Counter("quire_fragment_mended_total",
                 "Corrupt fragment copies persisted again from a good copy", ["store"])


class FragmentCorrupt(ChecksumMismatch):
    """No good copy of a fragment exists: every copy found failed its proof.

    `.journal`, `.fragment` (its name) and `.stores` (the store URLs whose copy failed)
    say what; `.url` / `.key` are the first corrupt copy's."""

    def __init__(self, message: str, url: str = "", key: str = "", journal: str = "",
                 fragment: str = "", stores: tuple[str, ...] = ()) -> None:
        StoreError.__init__(self, message, url, key)
        self.args = (message, url, key, journal, fragment, stores)
        self.journal = journal
        self.fragment = fragment
        self.stores = stores


def quarantine_key(key: str) -> str:
    return QUARANTINE_PREFIX + key


class Proven:
    """A fragment's raw content, held until its proof passed: the first `spill_bytes` as
    the chunks came (no copy), the rest in an unnamed temp file. `chunks(skip, size)`
    hands it on; `close()` releases it."""

    def __init__(self, spill_bytes: int = SPILL_BYTES) -> None:
        self.spill_bytes = spill_bytes
        self.size = 0
        self._mem: list[bytes] = []
        self._mem_size = 0
        self._file: IO[bytes] | None = None
        self.shared = False

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._file is None and self._mem_size + len(chunk) <= self.spill_bytes:
            self._mem.append(bytes(chunk) if not isinstance(chunk, bytes) else chunk)
            self._mem_size += len(chunk)
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self._file.write(chunk)

    def chunks(self, skip: int = 0, size: int = READ_CHUNK) -> Iterator[bytes]:
        """The content from byte `skip` on: the chunks held in memory, then (spilled)
        reads of `size` from the temp file. Several passes may be made."""
        for held in self._mem:
            if skip >= len(held):
                skip -= len(held)
                continue
            yield held[skip:] if skip else held
            skip = 0
        if self._file is not None:
            self._file.seek(skip)
            while data := self._file.read(size):
                yield data

    @property
    def in_memory(self) -> bool:
        return self._file is None

    def close(self) -> None:
        if self.shared:
            return  # cached: dropped (not closed) on eviction; its chunks are immutable
        self._mem = []
        if self._file is not None:
            self._file.close()
            self._file = None


class _Cache:
    """Proven in-memory content by fragment name, at most CACHE_BYTES in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: OrderedDict[str, Proven] = OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    def get(self, name: str) -> Proven | None:
        with self.lock:
            hit = self.held.get(name)
            if hit is not None:
                self.held.move_to_end(name)
            return hit

    def put(self, name: str, proven: Proven) -> None:
        if not proven.in_memory or proven.size > self.limit:
            return
        with self.lock:
            if name in self.held:
                return
            proven.shared = True
            self.held[name] = proven
            self.size += proven.size
            while self.size > self.limit:
                _, old = self.held.popitem(last=False)
                self.size -= old.size


_CACHE = _Cache(CACHE_BYTES)


def prove(fragment: Fragment, raw_chunks: Iterable[bytes], url: str = "", key: str = "",
          spill_bytes: int = SPILL_BYTES) -> Proven:
    """Raw content chunks in, the fragment's proven content out (`Proven`) — or
    ChecksumMismatch (length or SHA-1) / CodecError. The caller closes it.

    From HASH_THREAD_BYTES on, a helper thread hashes and holds (or spills) each chunk
    while this one fetches and decompresses the next: the proof's CPU then runs beside
    the read's instead of after it."""
    key = key or fragment_key(fragment)
    expected = fragment.content_length
    out = Proven(spill_bytes)
    helper = _Helper(out) if expected >= HASH_THREAD_BYTES else None
    sha, total = hashlib.sha1(), 0
    try:
        for chunk in raw_chunks:
            total += len(chunk)
            if total > expected:
                raise ChecksumMismatch(f"content is longer than the fragment's {expected} bytes",
                                       url, key)
            if helper is not None:
                helper.put(chunk)
            else:
                sha.update(chunk)
                out.write(chunk)
        if total != expected:
            raise ChecksumMismatch(f"content has {total} bytes, the fragment {expected}", url, key)
        digest = helper.finish() if helper is not None else sha.hexdigest()
        helper = None
        if digest != fragment.sum:
            raise ChecksumMismatch(f"content SHA-1 {digest} != fragment sum {fragment.sum}",
                                   url, key)
    except BaseException:
        if helper is not None:
            helper.abandon()
        out.close()
        raise
    return out


class _Helper:
    """SHA-1 and `Proven.write` on a helper thread, fed chunks in order through a bounded
    queue (a few chunks ahead). hashlib releases the GIL over buffers > 2 KiB and file
    writes release it too, so this runs beside the decompression of the next chunks."""

    _STOP = object()

    def __init__(self, out: Proven) -> None:
        self.sha = hashlib.sha1()
        self.out = out
        self.error: BaseException | None = None
        self.abandoned = False
        self.q: queue.Queue[object] = queue.Queue(maxsize=4)
        self.thread = threading.Thread(target=self._run, name="quire-sha1", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (chunk := self.q.get()) is not self._STOP:
            if self.error is not None or self.abandoned:
                continue  # drain until the stop
            try:
                self.sha.update(chunk)  # type: ignore[arg-type]
                self.out.write(chunk)  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 - re-raised by finish()
                self.error = exc

    def put(self, chunk: bytes) -> None:
        self.q.put(chunk)

    def finish(self) -> str:
        self.q.put(self._STOP)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.sha.hexdigest()

    def abandon(self) -> None:
        self.abandoned = True
        self.q.put(self._STOP)
        self.thread.join()


def prove_stored(store: FragmentStore, fragment: Fragment,
                 spill_bytes: int = SPILL_BYTES) -> Proven:
    """Fetch the whole stored object of `fragment`, decompress and prove it (see `prove`).
    FragmentNotFound raises if there is no object; other StoreErrors as the store says."""
    key = fragment_key(fragment)
    stored = store.get(key)
    try:
        return prove(fragment, decompress_chunks(fragment.codec, stored), store.url, key,
                     spill_bytes)
    except CodecError as exc:
        raise ChecksumMismatch(f"stored bytes do not decode as {fragment.codec.value}: {exc}",
                               store.url, key) from None
    finally:
        close = getattr(stored, "close", None)
        if close is not None:
            close()


def quarantine(store: FragmentStore, key: str, *, keep_original: bool = False) -> str:
    """Put a corrupt object under QUARANTINE_PREFIX (never delete it); returns the new
    key. A move (`keep_original=False`: a rename on a file store, a server-side copy and
    delete on S3) when a good copy is about to replace it; a copy when none exists, so
    the key keeps failing loudly instead of leaving a silent gap in the journal."""
    target = quarantine_key(key)
    move = getattr(store, "quarantine", None)
    if move is not None:
        move(key, target, keep_original=keep_original)
    else:  # pragma: no cover - both built-in stores implement quarantine
        store.put(target, store.get(key))
        if not keep_original:
            store.delete(key)
    QUARANTINED.labels(store.url).inc()
    log.warning("fragment quarantined", store=store.url, key=key, quarantine_key=target,
                original_kept=keep_original)
    return target


def _was_quarantined(store: FragmentStore, key: str) -> bool:
    try:
        return store.exists(quarantine_key(key))
    except StoreError:
        return False


def report_corrupt(store_url: str, key: str, why: str) -> None:
    CORRUPT.labels(store_url).inc()
    VERIFIED.labels("corrupt").inc()
    log.error("fragment corrupt", store=store_url, key=key, reason=why)
