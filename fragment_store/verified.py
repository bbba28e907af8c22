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

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

from protocol import Fragment, ValidationError
from protocol.logs import get_logger

from .errors import ChecksumMismatch, FragmentNotFound, StoreError
from .keys import fragment_key, fragment_name
from .persist import persist_fragment, stream_unverified
from .proof import (
    _CACHE,
    BATCH_SPILL_BYTES,
    CACHE_BYTES,
    CORRUPT,
    MENDED,
    QUARANTINE_PREFIX,
    QUARANTINED,
    SPILL_BYTES,
    VERIFIED,
    FragmentCorrupt,
    Proven,
    _was_quarantined,
    prove,
    prove_stored,
    quarantine,
    quarantine_key,
    report_corrupt,
)
from .stores.base import READ_CHUNK, FragmentStore

__all__ = ["BATCH_SPILL_BYTES", "CACHE_BYTES", "CORRUPT", "MENDED", "QUARANTINED", "QUARANTINE_PREFIX", "SPILL_BYTES",
           "VERIFIED", "Extra", "FragmentCorrupt", "Proven", "mend", "prove", "prove_stored",
           "quarantine", "quarantine_key", "read_fragment", "read_verified", "report_corrupt",
           "verify_stored"]

log = get_logger(__name__)

Extra = tuple[str, Callable[[], Iterable[bytes]]]
"""Another copy of a fragment's *raw* content: (a label for logs, a supplier of chunks)."""


def mend(store: FragmentStore, fragment: Fragment, content: Proven) -> bool:
    """Persist `content` (proven raw content) again under the fragment's key in `store`;
    False (logged) when the store refuses."""
    try:
        persist_fragment(store, fragment, content.chunks())
    except StoreError as exc:
        log.warning("fragment not mended", store=store.url, key=fragment_key(fragment),
                    error=str(exc))
        return False
    MENDED.labels(store.url).inc()
    log.info("fragment mended", store=store.url, key=fragment_key(fragment))
    return True


class _Stream:
    """The chunks of proven content from `skip` on, at most `chunk` bytes each. `close()`
    releases the content even if iteration never started (a read-ahead that was not
    consumed), and at the end of the iteration."""

    def __init__(self, content: Proven, skip: int, chunk: int) -> None:
        self.content = content
        self._gen: Generator[bytes, None, None] = self._run(skip, chunk)

    def _run(self, skip: int, chunk: int) -> Generator[bytes, None, None]:
        try:
            for data in self.content.chunks(skip, chunk):
                # Held chunks may be larger than asked for (a decompressor's 1 MiB).
                for i in range(0, len(data), chunk):
                    yield data[i:i + chunk] if len(data) > chunk else data
        finally:
            self.content.close()

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> bytes:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()
        self.content.close()


def _stream(content: Proven, skip: int, chunk: int) -> Iterator[bytes]:
    return _Stream(content, skip, chunk)


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
        if first is None:
            raise ValidationError("fragment.backing_store", "an unpersisted fragment has no store")
        VERIFIED.labels("unverified").inc()
        return stream_unverified(first, fragment, start)

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
            supplied = None
            try:
                supplied = supply()
                good = prove(fragment, supplied, label, key, spill_bytes)
                break
            except ChecksumMismatch as exc:
                report_corrupt(label, key, exc.message)
            except Exception as exc:  # noqa: BLE001 - another copy is only a hope
                log.info("no copy from an extra source", source=label, key=key, error=str(exc))
            finally:
                close = getattr(supplied, "close", None)
                if close is not None:
                    close()  # a supplier's connection, if it was not read to its end
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


def read_fragment(store: FragmentStore, fragment: Fragment, offset: int | None = None, *,
                  verify: bool = True) -> Iterator[bytes]:
    """Raw content of a persisted fragment in `store` from `offset` (default: its begin).

    `verify` (the default): `read_verified` on this one store — proven before the first
    byte, a corrupt copy quarantined, FragmentCorrupt raised (callers wanting other
    copies tried call `read_verified` with the journal's stores). `verify=False`
    (what `unverified_reads_risk_corruption` selects): streamed unproven
    (`persist.stream_unverified`; only the length is checked, after the bytes)."""
    if verify:
        return read_verified(fragment, offset, store=store)
    return stream_unverified(store, fragment, offset)
