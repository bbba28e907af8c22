"""A shard's local store: RocksDB (rocksdict, raw bytes mode) plus a transaction overlay.

Reads see the current transaction's own writes (the overlay); `take()` turns the
overlay and the transaction's read-through offsets into one list of operations, the
unit that is appended to the recovery log and then applied with `apply()` as a single
RocksDB WriteBatch: state and offsets change atomically, or not at all.

quire's own keys live under b"\\x00q/" (read offsets, the recovery log offset);
application keys may not start with b"\\x00".
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

from rocksdict import Checkpoint, Options, Rdict, WriteBatch

from protocol.errors import ValidationError

__all__ = ["LOG_OFFSET_KEY", "OFFSET_PREFIX", "Op", "Store"]

OFFSET_PREFIX = b"\x00q/offset/"
LOG_OFFSET_KEY = b"\x00q/log-offset"

Op = tuple[bytes, bytes | None]
"""(key, value); value None deletes the key."""


def _key(key: bytes | str) -> bytes:
    k = key.encode() if isinstance(key, str) else bytes(key)
    if not k or k[:1] == b"\x00":
        raise ValidationError("key", f"{k!r}: application keys are non-empty and may not start with NUL")
    return k


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = Rdict(path, opts)
        self._overlay: dict[bytes, bytes | None] = {}

    # -- the application's view ----------------------------------------------------------

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        k = _key(key)
        if k in self._overlay:
            value = self._overlay[k]
            return default if value is None else value
        value = self.db.get(k)
        return default if value is None else value

    def put(self, key: bytes | str, value: bytes) -> None:
        self._overlay[_key(key)] = bytes(value)

    def delete(self, key: bytes | str) -> None:
        self._overlay[_key(key)] = None

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Committed items with a key prefix (the open transaction's writes excluded)."""
        it = self.db.items(from_key=prefix or b"\x01")
        for k, v in it:
            if not k.startswith(prefix):
                break
            yield k, v

    @property
    def pending(self) -> int:
        return len(self._overlay)

    # -- transactions --------------------------------------------------------------------

    def take(self, offsets: dict[str, int]) -> list[Op]:
        """The open transaction as operations (and a fresh, empty overlay)."""
        ops: list[Op] = list(self._overlay.items())
        ops.extend((OFFSET_PREFIX + j.encode(), str(o).encode()) for j, o in sorted(offsets.items()))
        self._overlay = {}
        return ops

    def discard(self) -> None:
        self._overlay = {}

    def apply(self, ops: list[Op], log_offset: int) -> None:
        """Apply ops and the new recovery-log offset in one atomic WriteBatch."""
        wb = WriteBatch(raw_mode=True)
        for k, v in ops:
            if v is None:
                wb.delete(k)
            else:
                wb.put(k, v)
        wb.put(LOG_OFFSET_KEY, str(log_offset).encode())
        self.db.write(wb)

    def offsets(self) -> dict[str, int]:
        return {k[len(OFFSET_PREFIX):].decode(): int(v)
                for k, v in self._internal(OFFSET_PREFIX)}

    @property
    def log_offset(self) -> int:
        value = self.db.get(LOG_OFFSET_KEY)
        return int(value) if value is not None else 0

    def _internal(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for k, v in self.db.items(from_key=prefix):
            if not k.startswith(prefix):
                break
            yield k, v

    # -- snapshots -----------------------------------------------------------------------

    def checkpoint(self, target: str) -> None:
        """A consistent RocksDB checkpoint (hard links) of the committed state at `target`."""
        if os.path.exists(target):
            shutil.rmtree(target)
        self.db.flush()
        Checkpoint(self.db).create_checkpoint(target)

    def close(self) -> None:
        self.db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
