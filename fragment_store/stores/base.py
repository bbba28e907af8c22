"""The narrow interface every fragment store implements, and what they share.

Keys are store-relative, clean paths (`journal/…/name`, `.quire/…`); a store joins them
to its root (a directory, or a bucket + prefix) and never reads or writes outside it.
Errors are `StoreError` subclasses (see fragment_store.errors); an operation on a
missing object raises `FragmentNotFound` at call time, not on first iteration.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO, NamedTuple, Union

from ..errors import InvalidStoreKey, StoreError

Data = Union[bytes, bytearray, memoryview, Iterable[bytes], BinaryIO]
"""What `put` accepts: a buffer, an iterable of chunks, or a readable binary file."""

HEALTH_KEY = ".quire/health-check"
READ_CHUNK = 1 << 20


class ObjectInfo(NamedTuple):
    key: str
    """Store-relative key."""
    size: int
    """Stored (compressed) size in bytes."""
    mod_time: int
    """Unix seconds of the last modification."""


def check_key(key: str) -> str:
    """Validate a store-relative key: non-empty, no leading '/', no '', '.', '..' segments."""
    if not isinstance(key, str) or not key:
        raise InvalidStoreKey("key", f"{key!r} is not a non-empty string")
    parts = key.split("/")
    if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InvalidStoreKey("key", f"{key!r} is not a clean relative path")
    if "\x00" in key or "\\" in key:
        raise InvalidStoreKey("key", f"{key!r} has a NUL or backslash")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a key prefix (it may end in '/')."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


class ChunkFile:
    """A minimal readable file over bytes, an iterable of chunks, or another file."""

    def __init__(self, data: Data) -> None:
        if hasattr(data, "read"):
            self._file: BinaryIO | None = data  # type: ignore[assignment]
            self._it: Iterator[bytes] = iter(())
        else:
            self._file = None
            self._it = iter([bytes(data)]) if isinstance(data, (bytes, bytearray, memoryview)) \
                else iter(data)  # type: ignore[arg-type]
        self._buf = b""
        self.consumed = 0

    def read(self, n: int = -1) -> bytes:
        if self._file is not None:
            out = self._file.read(n)
            self.consumed += len(out)
            return out
        while not self._buf:
            try:
                self._buf = bytes(next(self._it))
            except StopIteration:
                return b""
        if n < 0 or n >= len(self._buf):
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        self.consumed += len(out)
        return out


class FragmentStore(abc.ABC):
    """A place fragments live: `file:///dir/` or `s3://bucket/prefix/`."""

    url: str

    @abc.abstractmethod
    def put(self, key: str, data: Data, length: int = -1,
            content_encoding: str | None = None) -> ObjectInfo:
        """Write an object atomically: readers see all of it or nothing.

        `length` is the byte count if known (-1 streams, multipart on S3). If reading
        `data` raises, the exception propagates and nothing is visible under `key`.
        """

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size and mod time of an object; FragmentNotFound if absent."""

    def exists(self, key: str) -> bool:
        from ..errors import FragmentNotFound

        try:
            self.stat(key)
        except FragmentNotFound:
            return False
        return True

    @abc.abstractmethod
    def get(self, key: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The stored bytes [offset, offset+length) as chunks. Close the iterator (or
        exhaust it) to release the connection / file."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, recursively, in key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; removing an absent object is not an error."""

    def delete_many(self, keys: Iterable[str]) -> list[str]:
        """Remove several objects; absent ones are not an error. Returns the keys asked
        for, in order. S3 overrides this with batched DeleteObjects requests."""
        done: list[str] = []
        for key in keys:
            self.delete(key)
            done.append(key)
        return done

    @abc.abstractmethod
    def signed_url(self, key: str, ttl: float = 60.0) -> str:
        """A URL a client can GET the object from for `ttl` seconds."""

    def read_all(self, key: str) -> bytes:
        return b"".join(self.get(key))

    def health(self) -> float:
        """Probe put/get/list/delete of `.quire/health-check`; return seconds taken.

        Raises the StoreError of the first step that failed.
        """
        started = time.monotonic()
        payload = f"quire health check {time.time():.6f}\n".encode()
        self.put(HEALTH_KEY, payload, len(payload))
        got = self.read_all(HEALTH_KEY)
        if not got.startswith(b"quire health check"):
            raise StoreError("health check read back different content", self.url, HEALTH_KEY)
        if not any(info.key == HEALTH_KEY for info in self.list(".quire/")):
            raise StoreError("health check object missing from the listing", self.url, HEALTH_KEY)
        self.delete(HEALTH_KEY)
        return time.monotonic() - started

    def close(self) -> None:
        """Release pooled connections (optional)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
