"""Moving fragment content between a replica and a store.

`persist_fragment` streams raw bytes through the journal's codec into the store while
computing their SHA-1; the upload only completes if the bytes match the Fragment (length
and sum), so a wrong or short fragment never becomes visible under its content-addressed
key. Because the key is content-addressed, an object already under it *is* this
fragment: persisting again is a no-op (idempotent retries, several replicas racing).

Reading is in `verified` (`read_fragment`, `read_verified`: proven before any byte is
handed on); `stream_unverified` here is the unproven stream they use only when asked to
(`unverified_reads_risk_corruption`): the object as stored, its length checked when the
stream ends and nothing else.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from typing import BinaryIO, Union

import msgspec

from protocol import Codec, Fragment, ValidationError

from .codecs import compressor, decompress_chunks
from .errors import ChecksumMismatch, FragmentNotFound, InvalidFragmentKey
from .keys import fragment_key, journal_prefix, parse_key
from .stats import EMPTY, StoreStats, add
from .stores.base import READ_CHUNK, FragmentStore

log = logging.getLogger(__name__)

Raw = Union[bytes, bytearray, memoryview, Iterable[bytes], BinaryIO]


def _chunks(raw: Raw) -> Iterator[bytes]:
    if isinstance(raw, (bytes, bytearray, memoryview)):
        yield bytes(raw)
    elif hasattr(raw, "read"):
        while chunk := raw.read(READ_CHUNK):  # type: ignore[union-attr]
            yield chunk
    else:
        yield from raw  # type: ignore[misc]


def content_encoding(codec: Codec) -> str | None:
    """The Content-Encoding a codec is stored with (gzip-offload lets HTTP clients inflate)."""
    return "gzip" if codec == Codec.GZIP_OFFLOAD_DECOMPRESSION else None


def persist_fragment(store: FragmentStore, fragment: Fragment, raw_chunks: Raw) -> Fragment:
    """Compress and upload a fragment's raw content; return it with backing_store and
    mod_time set. Raises ChecksumMismatch (nothing written) if the content is not the
    fragment's, and StoreError subclasses for store failures (safe to retry)."""
    key = fragment_key(fragment)
    if fragment.content_length == 0:
        raise ValidationError("fragment", "an empty fragment is never persisted")
    try:
        info = store.stat(key)
    except FragmentNotFound:
        pass
    else:
        log.debug("fragment already persisted: %s%s", store.url, key)
        return msgspec.structs.replace(fragment, backing_store=store.url, mod_time=info.mod_time)

    expected = fragment.content_length
    comp = compressor(fragment.codec)

    def compressed() -> Iterator[bytes]:
        sha, n = hashlib.sha1(), 0
        for chunk in _chunks(raw_chunks):
            n += len(chunk)
            if n > expected:
                raise ChecksumMismatch(f"content is longer than the fragment's {expected} bytes",
                                       store.url, key)
            sha.update(chunk)
            out = comp.compress(chunk)
            if out:
                yield out
        # Checked before the last bytes are handed over, so the store never completes.
        if n != expected:
            raise ChecksumMismatch(f"content has {n} bytes, the fragment {expected}", store.url, key)
        if sha.hexdigest() != fragment.sum:
            raise ChecksumMismatch(f"content SHA-1 {sha.hexdigest()} != fragment sum {fragment.sum}",
                                   store.url, key)
        out = comp.flush()
        if out:
            yield out

    info = store.put(key, compressed(), -1, content_encoding=content_encoding(fragment.codec))
    log.info("persisted fragment %s%s (%d raw -> %d stored bytes)", store.url, key, expected, info.size)
    return msgspec.structs.replace(fragment, backing_store=store.url, mod_time=info.mod_time)


def stream_unverified(store: FragmentStore, fragment: Fragment,
                      offset: int | None = None) -> Iterator[bytes]:
    """Raw content of a persisted fragment from `offset` (default: its begin) to its end,
    NOT proven: a rotten byte reaches the caller. The object is opened now
    (FragmentNotFound raises here); the length is checked when the stream ends
    (ChecksumMismatch after the bytes were yielded). Use verified.read_fragment."""
    key = fragment_key(fragment)
    start = fragment.begin if offset is None else offset
    if not fragment.begin <= start <= fragment.end:
        raise ValidationError("offset", f"{start} is outside the fragment [{fragment.begin}, {fragment.end})")
    skip = start - fragment.begin
    if fragment.codec == Codec.NONE:
        stored = store.get(key, offset=skip)  # a raw object supports ranged reads
        expected, skip = fragment.content_length - skip, 0
    else:
        stored = store.get(key)
        expected = fragment.content_length
    return _raw(stored, fragment, key, store.url, skip, expected)


def _raw(stored: Iterator[bytes], fragment: Fragment, key: str, url: str, skip: int,
         expected: int) -> Iterator[bytes]:
    total = 0
    try:
        for chunk in decompress_chunks(fragment.codec, stored):
            total += len(chunk)
            if total > expected:
                raise ChecksumMismatch(f"fragment content is longer than {expected} bytes", url, key)
            if skip >= len(chunk):
                skip -= len(chunk)
                continue
            if skip:
                chunk, skip = chunk[skip:], 0
            yield chunk
    finally:
        close = getattr(stored, "close", None)
        if close is not None:
            close()
    if total != expected:
        raise ChecksumMismatch(f"fragment content has {total} bytes, expected {expected}", url, key)


def list_fragments(store: FragmentStore, journal: str) -> list[Fragment]:
    """Every fragment of `journal` in the store, in (begin, end) order, with backing_store
    and mod_time set. Objects whose names are not fragment keys are skipped with a warning.

    Note: a journal nested under this one (`a/b/c` under `a/b`) would list as a path
    postfix `c`; as in Gazette, do not nest journal names inside each other.
    """
    return list_fragments_stats(store, journal)[0]


def list_fragments_stats(store: FragmentStore, journal: str) -> tuple[list[Fragment], StoreStats]:
    """`list_fragments` and `store_stats` from ONE listing of the journal's prefix
    (the index refresh needs both, #49): the same objects are counted as listed — the
    fragment keys; anything else (foreign objects; quarantine lives outside the prefix)
    is skipped by both."""
    out: list[Fragment] = []
    total = EMPTY
    for info in store.list(journal_prefix(journal)):
        try:
            f = parse_key(journal, info.key, store_url=store.url, mod_time=info.mod_time)
        except InvalidFragmentKey as exc:
            log.warning("skipping foreign object %s%s: %s", store.url, info.key, exc.reason)
            continue
        out.append(f)
        total = add(total, StoreStats(1, info.size, info.mod_time, info.mod_time, f.begin, f.end))
    out.sort(key=lambda f: (f.begin, f.end, f.path_postfix))
    return out, total


def store_stats(store: FragmentStore, journal: str) -> StoreStats:
    """A journal's storage stats in `store`: `list_fragments_stats`'s, from one listing."""
    return list_fragments_stats(store, journal)[1]


def fragment_url(store: FragmentStore, fragment: Fragment, ttl: float = 60.0) -> str:
    """A URL a client can fetch the persisted fragment from directly."""
    return store.signed_url(fragment_key(fragment), ttl)


def delete_fragment(store: FragmentStore, fragment: Fragment) -> None:
    """Remove a persisted fragment (retention pruning)."""
    store.delete(fragment_key(fragment))
