"""Read a persisted fragment straight from its store (no broker in the data path).

`file://` and `s3://` fragments are read through fragment_store (the client holds the
store's credentials, as batch jobs do); `http(s)://` URLs are presigned GETs. Either way
the stored bytes are decompressed with the fragment's codec and **proven by the SHA-1 in
the fragment's name before any byte is handed on** (fragment_store.verified; bounded
memory, spilled to a temp file past 16 MiB), then the raw content before the wanted
offset is discarded. A copy that fails its proof raises `FragmentCorrupt` (from a
file:// or s3:// store the client can open, the object is also quarantined); the Reader
then reads that fragment through the broker instead, which tries the journal's other
stores. `unverified_reads_risk_corruption=True` (`quire read
--unverified-reads-risk-corruption`) streams the stored bytes unproven.

The store clients are blocking; each chunk is pulled in a worker thread so the event
loop keeps serving other reads and appends meanwhile.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

from protocol import Fragment
from protocol.errors import QuireError

CHUNK = 1 << 20
_stores: dict[str, Any] = {}


class StoreReadError(QuireError):
    """A persisted fragment could not be read from its store."""


def _open_store(url: str) -> Any:
    store = _stores.get(url)
    if store is None:
        import fragment_store

        opener = getattr(fragment_store, "open_store", None)
        if opener is None:  # older layout: the opener lives with the stores
            from fragment_store.stores import open_store as opener  # type: ignore[no-redef]
        store = _stores[url] = opener(url)
    return store


def _raw_chunks(url: str, fragment: Fragment) -> Iterator[bytes]:
    """The stored (compressed) bytes of a fragment."""
    if url.startswith(("http://", "https://")):
        with urllib.request.urlopen(url, timeout=60) as response:
            while True:
                chunk = response.read(CHUNK)
                if not chunk:
                    return
                yield chunk
    else:
        from fragment_store.keys import fragment_key

        store = _open_store(fragment.backing_store or url)
        chunks = store.get(fragment_key(fragment))
        try:
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()


def _content(url: str, fragment: Fragment, offset: int,
             unverified_reads_risk_corruption: bool = False) -> Iterator[bytes]:
    """Raw content of the fragment from `offset` on, proven before the first byte."""
    from fragment_store.codecs import decompress_chunks
    from fragment_store.errors import ChecksumMismatch, CodecError
    from fragment_store.keys import fragment_key, fragment_name
    from fragment_store.verified import FragmentCorrupt, prove, read_verified, report_corrupt

    if not url.startswith(("http://", "https://")):
        yield from read_verified(fragment, offset, store=_open_store(fragment.backing_store or url),
                                 mend_corrupt=False,
                                 unverified_reads_risk_corruption=unverified_reads_risk_corruption)
        return
    skip = max(0, offset - fragment.begin)
    raw = decompress_chunks(fragment.codec, _raw_chunks(url, fragment))
    if unverified_reads_risk_corruption:
        proven = None
        chunks: Iterator[bytes] = raw
    else:
        key, where = fragment_key(fragment), fragment.backing_store or url.split("?", 1)[0]
        try:
            proven = prove(fragment, raw, where, key)
        except (ChecksumMismatch, CodecError) as exc:
            report_corrupt(where, key, str(exc))
            raise FragmentCorrupt(f"journal {fragment.journal}: fragment {fragment_name(fragment)} "
                                  f"read from {where} is corrupt: {exc}", where, key,
                                  fragment.journal, fragment_name(fragment), (where,)) from None
        chunks = proven.chunks(0, CHUNK)
    try:
        for chunk in chunks:
            if skip:
                if len(chunk) <= skip:
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            yield chunk
    finally:
        if proven is not None:
            proven.close()


async def read_fragment_url(url: str, fragment: Fragment, offset: int, *,
                            unverified_reads_risk_corruption: bool = False) -> AsyncIterator[bytes]:
    """Async chunks of the fragment's raw content from `offset` to its end (proven first,
    unless `unverified_reads_risk_corruption`)."""
    iterator = _content(url, fragment, offset, unverified_reads_risk_corruption)
    sentinel = object()
    try:
        while True:
            try:
                chunk = await asyncio.to_thread(next, iterator, sentinel)
            except QuireError:
                raise
            except Exception as exc:  # noqa: BLE001 - store clients raise many types
                raise StoreReadError(f"reading {fragment.journal} {fragment.begin}-{fragment.end} "
                                     f"from {url}: {exc}") from exc
            if chunk is sentinel:
                return
            yield chunk  # type: ignore[misc]
    finally:
        await asyncio.to_thread(iterator.close)
