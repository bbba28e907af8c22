"""Store backends and the `open_store(url)` factory (one store object per URL+options)."""

from __future__ import annotations

import threading
from typing import Any

from protocol import validate_store_url

from .base import HEALTH_KEY, ChunkFile, Data, FragmentStore, ObjectInfo, check_key
from .file import FileStore
from .s3 import S3Store

__all__ = ["HEALTH_KEY", "ChunkFile", "Data", "FileStore", "FragmentStore", "ObjectInfo",
           "S3Store", "check_key", "clear_store_cache", "open_store"]

_CACHE: dict[tuple[str, tuple[tuple[str, Any], ...]], FragmentStore] = {}
_LOCK = threading.Lock()


def open_store(url: str, **options: Any) -> FragmentStore:
    """The store for a URL (`file:///dir/` or `s3://bucket/prefix/`), cached per URL and
    options. Options go to the backend (S3Store: endpoint, access_key, …)."""
    validate_store_url(url, "store")
    cache_key = (url, tuple(sorted((k, repr(v)) for k, v in options.items())))
    with _LOCK:
        store = _CACHE.get(cache_key)
        if store is None:
            if url.startswith("file://"):
                store = FileStore(url, **options)
            else:
                store = S3Store(url, **options)
            _CACHE[cache_key] = store
        return store


def clear_store_cache() -> None:
    """Forget cached stores (closing them); for tests and reconfiguration."""
    with _LOCK:
        stores = list(_CACHE.values())
        _CACHE.clear()
    for store in stores:
        store.close()
