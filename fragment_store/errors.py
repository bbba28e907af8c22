"""The exception tree of the fragment store layer.

    QuireError                      (protocol)
    ├── ValidationError             (protocol) .path names the field
    │   ├── InvalidFragmentKey      an object name is not a fragment key (skipped by listings)
    │   └── InvalidStoreKey         a key is not a clean relative path (it could escape the store)
    ├── CodecError                  compressed bytes do not decode: corrupt, truncated, trailing junk
    └── StoreError                  a store operation failed; .url and .key say where
        ├── StoreUnavailable        network error, timeout, 5xx; retriable
        ├── StoreAccessDenied       credentials rejected or permission missing
        ├── StoreNotFound           the bucket / root directory does not exist
        ├── FragmentNotFound        no object under the key
        └── ChecksumMismatch        content disagrees with its Fragment (SHA-1 or length);
                                    nothing was left visible under the final key

Every error keeps its constructor arguments in `.args`, so it survives pickling and
Celery's JSON exception transport.
"""

from __future__ import annotations

from protocol import QuireError, ValidationError


class InvalidFragmentKey(ValidationError):
    """An object name is not `<begin:016x>-<end:016x>-<sha1><ext>` (or the journal prefix
    is wrong). Listings skip such names with a warning; they are never fatal."""


class InvalidStoreKey(ValidationError):
    """A store key is empty, absolute, or has `.`/`..`/empty segments."""


class CodecError(QuireError):
    """Compressed content cannot be decoded."""


class StoreError(QuireError):
    """A store operation failed."""

    retriable = False

    def __init__(self, message: str, url: str = "", key: str = "") -> None:
        super().__init__(message, url, key)
        self.message = message
        self.url = url
        self.key = key

    def __str__(self) -> str:
        where = f"{self.url}{self.key}" if self.url or self.key else ""
        return f"{self.message} ({where})" if where else self.message


class StoreUnavailable(StoreError):
    """The store could not be reached in time, or answered with a server error."""

    retriable = True


class StoreAccessDenied(StoreError):
    """The store rejected our credentials or the operation."""


class StoreNotFound(StoreError):
    """The store itself (bucket, root directory) does not exist."""


class FragmentNotFound(StoreError):
    """No object exists under the key."""


class ChecksumMismatch(StoreError):
    """Content does not match its Fragment's SHA-1 or length."""
