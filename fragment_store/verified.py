"""The one verifying reader every path that reads a fragment from a store goes through.

A fragment's name carries the SHA-1 of its raw content, so a stored object proves
itself: `read_verified` fetches the whole object, decompresses it (the codec's own
checks — gzip's CRC, zstd's frame checksums — are only a first line), hashes the raw
content as it goes and keeps it (`Proven`: the decompressed chunks themselves, no copy,
up to `SPILL_BYTES`; past that everything goes to an unnamed temp file) — and hands out
**no byte before the SHA-1 and length matched**. Memory per read is therefore bounded by SPILL_BYTES (+ one
decompressed chunk), whatever the fragment's size; a read from an offset inside a
fragment still fetches and proves the whole object (the proof covers whole objects).

A copy that fails its proof is:

* reported — `quire_fragment_corrupt_total{store}` and a structlog `fragment corrupt`
  line naming store, key and why;
* quarantined under `.quire/quarantine/<key>` in its own store, never deleted: *moved*
  there when a good copy was found (and the key mended at once), *copied* there when
  none was — the rotten object then stays under its key so every later read fails
  loudly (FragmentCorrupt) rather than the journal silently growing a gap a listing
  would skip;
* replaced by the next copy: the other stores of the journal's `fragment.stores`,
  then any `extra` sources a caller offers (a coordinator: a replica's spool);
* mended — once a good copy was found, it is persisted again under the original key
  in every store whose copy was corrupt (`quire_fragment_mended_total`).

With `cache=True` (the batch readers) proven content held in memory is also kept in a
small per-process cache (`CACHE_BYTES`, least recently used out first), keyed by store
and key: a batch reader that reads past its span into the next fragment (to finish a
message) and then reads that fragment for its own span proves it once, not twice.

Only where no good copy exists does the read fail, with `FragmentCorrupt` naming the
journal, the fragment and every store whose copy failed.

`unverified_reads_risk_corruption=True` skips all of this and streams the object as
stored (the old, unproven path: a rotten byte reaches the caller). It exists for
measuring the cost and for emergencies; its name says what it risks.
"""

from __future__ import annotations

import hashlib
import os
import queue
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

from prometheus_client import Counter

from protocol import Fragment, ValidationError
from protocol.logs import get_logger

from .codecs import decompress_chunks
from .errors import ChecksumMismatch, CodecError, FragmentNotFound, StoreError
from .keys import fragment_key, fragment_name
from .stores.base import READ_CHUNK, FragmentStore

log = get_logger(__name__)

SPILL_BYTES = int(os.environ.get("QUIRE_VERIFY_SPILL_BYTES", "") or 16 << 20)
"""Raw content kept in memory while it is proven; past this it spills to a temp file
(QUIRE_VERIFY_SPILL_BYTES; the memory bound of one verifying read)."""
HASH_THREAD_BYTES = 1 << 20
"""Fragments at least this long are hashed on a helper thread while the next chunks are
fetched and decompressed (hashlib and zlib/zstd release the GIL): on an idle core the
proof then costs almost no wall time."""
CACHE_BYTES = 64 << 20
"""Proven in-memory content kept per process for the next read of the same fragment."""
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


Extra = tuple[str, Callable[[], Iterable[bytes]]]
"""Another copy of a fragment's *raw* content: (a label for logs, a supplier of chunks)."""


def quarantine_key(key: str) -> str:
    return QUARANTINE_PREFIX + key


class Proven:
    """A fragment's raw content, held until its proof passed: the chunks as they came
    (no copy) while they total at most `spill_bytes`, then all of it in an unnamed temp
    file. `chunks(skip, size)` hands it on; `close()` releases it."""

    def __init__(self, spill_bytes: int = SPILL_BYTES) -> None:
        self.spill_bytes = spill_bytes
        self.size = 0
        self._mem: list[bytes] = []
        self._file: IO[bytes] | None = None
        self.shared = False

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._file is None and self.size > self.spill_bytes:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
            for held in self._mem:
                self._file.write(held)
            self._mem = []
        if self._file is not None:
            self._file.write(chunk)
        else:
            self._mem.append(bytes(chunk) if not isinstance(chunk, bytes) else chunk)

    def chunks(self, skip: int = 0, size: int = READ_CHUNK) -> Iterator[bytes]:
        """The content from byte `skip` on (in memory: the chunks as held; spilled: reads
        of `size`). Several passes may be made."""
        if self._file is not None:
            self._file.seek(skip)
            while data := self._file.read(size):
                yield data
            return
        for held in self._mem:
            if skip >= len(held):
                skip -= len(held)
                continue
            yield held[skip:] if skip else held
            skip = 0

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
    ChecksumMismatch (length or SHA-1) / CodecError. The caller closes it."""
    key = key or fragment_key(fragment)
    expected = fragment.content_length
    out = Proven(spill_bytes)
    hasher = _Hasher() if expected >= HASH_THREAD_BYTES else None
    sha, total = hashlib.sha1(), 0
    try:
        for chunk in raw_chunks:
            total += len(chunk)
            if total > expected:
                raise ChecksumMismatch(f"content is longer than the fragment's {expected} bytes",
                                       url, key)
            if hasher is not None:
                hasher.put(chunk)
            else:
                sha.update(chunk)
            out.write(chunk)
        if total != expected:
            raise ChecksumMismatch(f"content has {total} bytes, the fragment {expected}", url, key)
        digest = hasher.digest() if hasher is not None else sha.hexdigest()
        hasher = None
        if digest != fragment.sum:
            raise ChecksumMismatch(f"content SHA-1 {digest} != fragment sum {fragment.sum}",
                                   url, key)
    except BaseException:
        out.close()
        raise
    finally:
        if hasher is not None:
            hasher.digest()  # stop the helper thread
    return out


class _Hasher:
    """SHA-1 on a helper thread, fed chunks in order (a bounded queue: a few chunks ahead)."""

    def __init__(self) -> None:
        self.sha = hashlib.sha1()
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self.thread = threading.Thread(target=self._run, name="quire-sha1", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (chunk := self.q.get()) is not None:
            self.sha.update(chunk)

    def put(self, chunk: bytes) -> None:
        self.q.put(chunk)

    def digest(self) -> str:
        self.q.put(None)
        self.thread.join()
        return self.sha.hexdigest()


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


def mend(store: FragmentStore, fragment: Fragment, content: Proven) -> bool:
    """Persist `content` (proven raw content) again under the fragment's key in `store`;
    False (logged) when the store refuses."""
    from .persist import persist_fragment

    try:
        persist_fragment(store, fragment, content.chunks())
    except StoreError as exc:
        log.warning("fragment not mended", store=store.url, key=fragment_key(fragment),
                    error=str(exc))
        return False
    MENDED.labels(store.url).inc()
    log.info("fragment mended", store=store.url, key=fragment_key(fragment))
    return True


def _stream(content: Proven, skip: int, chunk: int) -> Iterator[bytes]:
    try:
        for data in content.chunks(skip, chunk):
            # Held chunks may be larger than asked for (a decompressor's 1 MiB).
            for i in range(0, len(data), chunk):
                yield data[i:i + chunk] if len(data) > chunk else data
    finally:
        content.close()


def read_verified(fragment: Fragment, offset: int | None = None, *,
                  store: FragmentStore | None = None,
                  stores: Sequence[str] = (),
                  extra: Sequence[Extra] = (),
                  open_store: Callable[[str], FragmentStore] | None = None,
                  mend_corrupt: bool = True,
                  spill_bytes: int = SPILL_BYTES,
                  chunk: int = READ_CHUNK,
                  cache: bool = False,
                  unverified_reads_risk_corruption: bool = False) -> Iterator[bytes]:
    """Proven raw content of `fragment` from `offset` (default its begin) to its end.

    Copies are tried in order: `store` (default: the fragment's backing_store), then the
    other `stores` URLs (the journal's `fragment.stores`), then `extra` sources. The
    first copy that proves itself is returned as an iterator of chunks; every copy that
    failed before it was reported and quarantined, and is mended from it
    (`mend_corrupt`). Everything happens before this returns: FragmentNotFound (no copy
    anywhere), FragmentCorrupt (copies, none good) or the first StoreError raise here.
    `cache`: take and keep proven content in the per-process cache (batch readers).
    """
    opener = open_store
    if opener is None:
        from .stores import open_store as opener  # type: ignore[no-redef]
    start = fragment.begin if offset is None else offset
    if not fragment.begin <= start <= fragment.end:
        raise ValidationError("offset", f"{start} is outside the fragment [{fragment.begin}, {fragment.end})")
    first = store if store is not None else opener(fragment.backing_store) if fragment.backing_store \
        else None
    if unverified_reads_risk_corruption:
        from .persist import read_fragment

        if first is None:
            raise ValidationError("fragment.backing_store", "an unpersisted fragment has no store")
        VERIFIED.labels("unverified").inc()
        return read_fragment(first, fragment, start, verify=False)

    name = f"{first.url if first is not None else ''}{fragment_key(fragment)}"
    cached = _CACHE.get(name) if cache else None
    if cached is not None:
        VERIFIED.labels("cached").inc()
        return _stream(cached, start - fragment.begin, chunk)
    candidates: list[FragmentStore] = [first] if first is not None else []
    for url in stores:
        if url and all(url != c.url for c in candidates):
            candidates.append(opener(url))
    key = fragment_key(fragment)
    corrupt: list[FragmentStore] = []
    missing: list[FragmentStore] = []
    first_error: StoreError | None = None
    good: Proven | None = None
    for candidate in candidates:
        try:
            good = prove_stored(candidate, fragment, spill_bytes)
            break
        except ChecksumMismatch as exc:
            report_corrupt(candidate.url, key, exc.message)
            corrupt.append(candidate)
        except FragmentNotFound as exc:
            if _was_quarantined(candidate, key):
                missing.append(candidate)  # moved aside by an earlier read: mend it too
            elif first_error is None:
                first_error = exc
        except StoreError as exc:
            if first_error is None:
                first_error = exc
    if good is None:
        for label, supply in extra:
            try:
                good = prove(fragment, supply(), label, key, spill_bytes)
                break
            except ChecksumMismatch as exc:
                report_corrupt(label, key, exc.message)
            except Exception as exc:  # noqa: BLE001 - another copy is only a hope
                log.info("no copy from an extra source", source=label, key=key, error=str(exc))
    for bad in corrupt:
        try:  # moved aside if a good copy replaces it, else kept in place (and copied)
            quarantine(bad, key, keep_original=good is None)
        except StoreError as qexc:
            log.error("corrupt fragment not quarantined", store=bad.url, key=key, error=str(qexc))
    if good is None:
        if corrupt:
            urls = tuple(c.url for c in corrupt)
            raise FragmentCorrupt(
                f"journal {fragment.journal}: fragment {fragment_name(fragment)} is corrupt in "
                f"{', '.join(urls)} and no good copy exists", corrupt[0].url, key,
                fragment.journal, fragment_name(fragment), urls)
        if first_error is not None:
            raise first_error
        raise FragmentNotFound("no store holds the fragment", "", key)
    VERIFIED.labels("ok" if not corrupt else "recovered").inc()
    if corrupt or missing:
        log.warning("fragment read from a good copy", key=key, corrupt_in=[c.url for c in corrupt])
        if mend_corrupt:
            for bad in corrupt + missing:
                mend(bad, fragment, good)
    if cache:
        _CACHE.put(name, good)
    return _stream(good, start - fragment.begin, chunk)


def verify_stored(store: FragmentStore, fragment: Fragment, *, report: bool = True, **kw: Any) -> str:
    """Prove one stored copy without reading it further: '' if good, else why not. The
    corrupt copy is reported (unless `report=False`: the caller's read_verified will),
    not quarantined — callers decide. For the scrub."""
    key = fragment_key(fragment)
    try:
        content = prove_stored(store, fragment, **kw)
    except ChecksumMismatch as exc:
        if report:
            report_corrupt(store.url, key, exc.message)
        return exc.message
    content.close()
    VERIFIED.labels("ok").inc()
    return ""
