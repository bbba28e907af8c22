"""Read a persisted fragment straight from its store (no broker in the data path).

`file://` and `s3://` fragments are read through fragment_store (the client holds the
store's credentials, as batch jobs do); `http(s)://` URLs are presigned GETs. Either way
the stored bytes are decompressed with the fragment's codec and the raw content before
the wanted offset is discarded — stores hold compressed objects, so there is no seeking
into the middle of one.

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


def _content(url: str, fragment: Fragment, offset: int) -> Iterator[bytes]:
    """Raw content of the fragment from `offset` on."""
    from fragment_store.codecs import decompress_chunks

    skip = max(0, offset - fragment.begin)
    for chunk in decompress_chunks(fragment.codec, _raw_chunks(url, fragment)):
        if skip:
            if len(chunk) <= skip:
                skip -= len(chunk)
                continue
            chunk, skip = chunk[skip:], 0
        yield chunk


async def read_fragment_url(url: str, fragment: Fragment, offset: int) -> AsyncIterator[bytes]:
    """Async chunks of the fragment's raw content from `offset` to its end."""
    iterator = _content(url, fragment, offset)
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
