"""Content-addressed object keys of persisted fragments.

A fragment of journal `a/b` spanning [begin, end) with SHA-1 `s` is stored under

    a/b/[<path postfix>/]<begin:016x>-<end:016x>-<s><ext>

relative to the store URL. Offsets are fixed-width lower-case hex, so within one
directory the lexicographic order of a listing is offset order, and two replicas that
built the same span produce the same key (persistence is idempotent). The extension
names the codec: `.raw`, `.gz`, `.zst`, `.sz`, and none for gzip-offload; the parser also
accepts Gazette's long forms `.gzip .zstandard .snappy .gzod`, case-insensitively.

Keys are relative: a store joins them to its own root (bucket + prefix, or a directory).
"""

from __future__ import annotations

import re

from protocol import Codec, Fragment, ValidationError, validate_journal_name
from protocol.names import JOURNAL_NAME_MAX, validate_path

from .errors import InvalidFragmentKey

EXTENSION: dict[Codec, str] = {
    Codec.NONE: ".raw",
    Codec.GZIP: ".gz",
    Codec.ZSTANDARD: ".zst",
    Codec.SNAPPY: ".sz",
    Codec.GZIP_OFFLOAD_DECOMPRESSION: "",
}
"""The extension written for each codec."""

PARSED_EXTENSIONS: dict[str, Codec] = {
    ".raw": Codec.NONE,
    ".gz": Codec.GZIP,
    ".gzip": Codec.GZIP,
    ".zst": Codec.ZSTANDARD,
    ".zstandard": Codec.ZSTANDARD,
    ".sz": Codec.SNAPPY,
    ".snappy": Codec.SNAPPY,
    ".gzod": Codec.GZIP_OFFLOAD_DECOMPRESSION,
    "": Codec.GZIP_OFFLOAD_DECOMPRESSION,
}
"""Every extension the parser accepts (compared lower-cased)."""

_NAME = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{40})((?:\.[A-Za-z]+)?)")


def extension(codec: Codec) -> str:
    return EXTENSION[Codec(codec)]


def journal_prefix(journal: str) -> str:
    """The listing prefix of a journal's fragments (`<journal>/`)."""
    validate_journal_name(journal, "journal")
    return journal + "/"


def validate_postfix(postfix: str, path: str = "fragment.path_postfix") -> None:
    """A postfix is a clean relative path whose segments do not start with '.'."""
    if not postfix:
        return
    validate_path(postfix, path, 1, JOURNAL_NAME_MAX)
    if any(part.startswith(".") for part in postfix.split("/")):
        raise ValidationError(path, f"{postfix!r}: a path segment may not begin with '.'")


def fragment_name(fragment: Fragment) -> str:
    """The base name `<begin:016x>-<end:016x>-<sha1><ext>`."""
    return f"{fragment.begin:016x}-{fragment.end:016x}-{fragment.sum}{extension(fragment.codec)}"


def fragment_key(fragment: Fragment) -> str:
    """The store-relative key of a fragment. Raises ValidationError for a bad fragment."""
    fragment.validate()
    if fragment.end >= 1 << 64:
        raise ValidationError("fragment.end", f"{fragment.end} does not fit 16 hex digits")
    validate_postfix(fragment.path_postfix)
    middle = f"{fragment.path_postfix}/" if fragment.path_postfix else ""
    return f"{fragment.journal}/{middle}{fragment_name(fragment)}"


def parse_name(journal: str, name: str, *, path_postfix: str = "", store_url: str = "",
               mod_time: int = 0) -> Fragment:
    """Parse a base name; raise InvalidFragmentKey if it is not a fragment name."""
    m = _NAME.fullmatch(name)
    if m is None:
        raise InvalidFragmentKey("key", f"{name!r} is not <begin:016x>-<end:016x>-<sha1><ext>")
    codec = PARSED_EXTENSIONS.get(m[4].lower())
    if codec is None:
        raise InvalidFragmentKey("key", f"{name!r} has an unknown extension {m[4]!r}")
    fragment = Fragment(journal=journal, begin=int(m[1], 16), end=int(m[2], 16), sum=m[3],
                        codec=codec, backing_store=store_url, mod_time=mod_time,
                        path_postfix=path_postfix)
    try:
        fragment.validate("key")
    except ValidationError as exc:
        raise InvalidFragmentKey(exc.path, f"{name!r}: {exc.reason}") from None
    if fragment.begin == fragment.end:
        raise InvalidFragmentKey("key", f"{name!r} names an empty fragment")
    return fragment


def parse_key(journal: str, key: str, *, store_url: str = "", mod_time: int = 0) -> Fragment:
    """The Fragment a store-relative key names.

    `key` must be `<journal>/[<postfix>/]<name>`; anything else (a foreign object, a
    temp file, another journal's key) raises InvalidFragmentKey, which listings skip.
    """
    prefix = journal + "/"
    if not key.startswith(prefix):
        raise InvalidFragmentKey("key", f"{key!r} is not under {prefix!r}")
    postfix, sep, name = key[len(prefix):].rpartition("/")
    if sep and not postfix:
        raise InvalidFragmentKey("key", f"{key!r} has an empty path segment")
    try:
        validate_postfix(postfix, "key")
    except ValidationError as exc:
        raise InvalidFragmentKey("key", f"{key!r}: bad path postfix: {exc.reason}") from None
    return parse_name(journal, name, path_postfix=postfix, store_url=store_url, mod_time=mod_time)
