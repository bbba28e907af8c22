"""A fragment store in a local directory: `file:///abs/dir/`.

Writes go to a temp file in the target's directory (`.quire-tmp-*`, skipped by listings),
are fsynced, then renamed over the key, so a reader sees a whole object or none. Every
key is resolved under the root and checked to stay there (symlinks included).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

from protocol import validate_store_url

from ..errors import FragmentNotFound, StoreError, StoreNotFound, StoreUnavailable
from .base import READ_CHUNK, ChunkFile, Data, FragmentStore, ObjectInfo, check_key, check_prefix

TMP_PREFIX = ".quire-tmp-"


def _os_error(exc: OSError, url: str, key: str) -> StoreError:
    if isinstance(exc, FileNotFoundError):
        return FragmentNotFound("no such object", url, key)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        from ..errors import StoreAccessDenied

        return StoreAccessDenied(f"permission denied: {exc.strerror}", url, key)
    return StoreUnavailable(f"{type(exc).__name__}: {exc.strerror or exc}", url, key)


class FileStore(FragmentStore):
    def __init__(self, url: str, *, create: bool = True, fsync: bool = True) -> None:
        validate_store_url(url, "store")
        if not url.startswith("file://"):
            raise StoreError("not a file:// URL", url)
        self.url = url
        self.root = Path(unquote(url[len("file://"):])).resolve()
        self._fsync = fsync
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise _os_error(exc, url, "") from None

    def _path(self, key: str) -> Path:
        check_key(key)
        path = self.root / key
        # Symlinks inside the root must not lead out of it.
        real = Path(os.path.realpath(path))
        if real != self.root and self.root not in real.parents:
            raise StoreError("key resolves outside the store root", self.url, key)
        return path

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise StoreNotFound("store root directory does not exist", self.url)

    def put(self, key: str, data: Data, length: int = -1,
            content_encoding: str | None = None) -> ObjectInfo:
        path = self._path(key)
        self._check_root()
        tmp = path.with_name(f"{TMP_PREFIX}{secrets.token_hex(8)}")
        src = ChunkFile(data)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as f:
                while chunk := src.read(READ_CHUNK):
                    f.write(chunk)
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
            if length >= 0 and src.consumed != length:
                raise StoreError(f"expected {length} bytes, got {src.consumed}", self.url, key)
            os.replace(tmp, path)
        except OSError as exc:
            raise _os_error(exc, self.url, key) from None
        finally:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        if self._fsync:
            _fsync_dir(path.parent)
        return self.stat(key)

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except OSError as exc:
            raise _os_error(exc, self.url, key) from None
        if not path.is_file():
            raise FragmentNotFound("not an object (a directory)", self.url, key)
        return ObjectInfo(key, st.st_size, int(st.st_mtime))

    def get(self, key: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        path = self._path(key)
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"bad range offset={offset} length={length}")
        try:
            f = open(path, "rb")
        except IsADirectoryError:
            raise FragmentNotFound("not an object (a directory)", self.url, key) from None
        except OSError as exc:
            raise _os_error(exc, self.url, key) from None
        return self._read(f, key, offset, length)

    def _read(self, f, key: str, offset: int, length: int | None) -> Iterator[bytes]:  # type: ignore[no-untyped-def]
        with f:
            try:
                f.seek(offset)
                remaining = -1 if length is None else length
                while remaining:
                    chunk = f.read(READ_CHUNK if remaining < 0 else min(READ_CHUNK, remaining))
                    if not chunk:
                        return
                    if remaining > 0:
                        remaining -= len(chunk)
                    yield chunk
            except OSError as exc:
                raise _os_error(exc, self.url, key) from None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        self._check_root()
        # Walk the deepest directory the prefix names, then filter by the whole prefix.
        base = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        found: list[ObjectInfo] = []
        for dirpath, _dirs, files in os.walk(base, onerror=None, followlinks=False):
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in files:
                if name.startswith(TMP_PREFIX):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while listing
                found.append(ObjectInfo(key, st.st_size, int(st.st_mtime)))
        found.sort()  # S3 lists in key order; so do we
        return iter(found)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _os_error(exc, self.url, key) from None
        # Emptied directories stay: removing them would race a concurrent put.

    def quarantine(self, key: str, target: str, *, keep_original: bool = False) -> None:
        """Move an object to `target` (a rename: the bytes stay as they were), or copy it
        there (`keep_original`)."""
        src, dst = self._path(key), self._path(target)
        if keep_original:
            self.put(target, self.get(key))
            return
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
        except FileNotFoundError:
            raise FragmentNotFound("no such object", self.url, key) from None
        except OSError as exc:
            raise _os_error(exc, self.url, key) from None
        if self._fsync:
            _fsync_dir(dst.parent)
            _fsync_dir(src.parent)

    def signed_url(self, key: str, ttl: float = 60.0) -> str:
        return self._path(key).as_uri()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
