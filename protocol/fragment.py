"""Fragments: content-addressed spans [begin, end) of a journal.

A Fragment names its bytes by SHA-1, so two replicas that built the same span produce
the same fragment (and the same object key in a store; see fragment_store.keys).
"""

from __future__ import annotations

import enum

import msgspec

from .errors import ValidationError
from .names import validate_journal_name, validate_path

EMPTY_SUM = "0" * 40
"""The sum of an empty fragment (Gazette uses an all-zero SHA1Sum)."""


class Codec(str, enum.Enum):
    """Compression of a persisted fragment. The spool always holds raw bytes."""

    NONE = "none"
    GZIP = "gzip"
    ZSTANDARD = "zstd"
    SNAPPY = "snappy"
    GZIP_OFFLOAD_DECOMPRESSION = "gzip-offload"


class Fragment(msgspec.Struct, frozen=True, kw_only=True):
    journal: str
    begin: int = 0
    end: int = 0
    sum: str = EMPTY_SUM
    """Lower-case hex SHA-1 of the raw (uncompressed) content."""
    codec: Codec = Codec.NONE
    backing_store: str = ""
    """Store URL the fragment was persisted to; empty while only local."""
    mod_time: int = 0
    """Unix seconds the store last modified the object (0 while local)."""
    path_postfix: str = ""

    @property
    def content_length(self) -> int:
        return self.end - self.begin

    @property
    def is_persisted(self) -> bool:
        return bool(self.backing_store)

    def covers(self, offset: int) -> bool:
        return self.begin <= offset < self.end

    def validate(self, path: str = "fragment") -> None:
        validate_journal_name(self.journal, f"{path}.journal")
        if self.begin < 0 or self.end < self.begin:
            raise ValidationError(f"{path}.end", f"invalid range [{self.begin}, {self.end})")
        if len(self.sum) != 40 or any(c not in "0123456789abcdef" for c in self.sum):
            raise ValidationError(f"{path}.sum", f"expected 40 lower-case hex digits, got {self.sum!r}")
        if self.path_postfix:
            validate_path(self.path_postfix, f"{path}.path_postfix", 1, 512)
        if self.begin == self.end and self.sum != EMPTY_SUM:
            raise ValidationError(f"{path}.sum", "an empty fragment has the all-zero sum")
