"""Rules for names that become etcd keys and object-store paths (Gazette's validator.go).

A *token* is letters and digits plus `-_+/.`; a *path component* also admits `=%` (for
Hive-style `date=2024-01-01/` postfixes). Paths must already be in clean form: no
leading `/`, no `//`, no `.` or `..` segments, no trailing `/` — so a journal name maps to
exactly one store prefix and can never climb out of it.
"""

from __future__ import annotations

import re

from .errors import ValidationError

TOKEN_SYMBOLS = "-_+/."
PATH_SYMBOLS = TOKEN_SYMBOLS + "=%"

JOURNAL_NAME_MIN, JOURNAL_NAME_MAX = 4, 512
LABEL_NAME_MIN, LABEL_NAME_MAX = 2, 64
LABEL_VALUE_MAX = 1024
ZONE_MIN, ZONE_MAX = 1, 32
SUFFIX_MIN, SUFFIX_MAX = 4, 128

# \w admits letters, digits and underscore in any script; Gazette allows Unicode letters
# and digits, so this is the same alphabet once the extra symbols are added.
_TOKEN_RE = re.compile(r"[\w\-+/.]*")
_PATH_RE = re.compile(r"[\w\-+/.=%]*")
_PATTERNS: dict[str, re.Pattern[str]] = {TOKEN_SYMBOLS: _TOKEN_RE, PATH_SYMBOLS: _PATH_RE}


def _pattern(symbols: str) -> re.Pattern[str]:
    # One pattern per symbol set: zones and suffixes must not admit '/' (or '#').
    pat = _PATTERNS.get(symbols)
    if pat is None:
        pat = _PATTERNS[symbols] = re.compile(r"[\w" + re.escape(symbols) + r"]*")
    return pat


def validate_token(value: str, path: str, min_len: int, max_len: int,
                   symbols: str = TOKEN_SYMBOLS) -> None:
    if not isinstance(value, str):
        raise ValidationError(path, f"expected a string, got {type(value).__name__}")
    # Lengths count UTF-8 bytes, as Gazette's do: names become object keys, and S3 limits
    # keys to 1024 bytes, not characters.
    size = len(value.encode("utf-8", "surrogatepass"))
    if not (min_len <= size <= max_len):
        raise ValidationError(
            path, f"invalid length {size} (expected {min_len} <= length <= {max_len}): {value!r}")
    if not _pattern(symbols).fullmatch(value):
        bad = next((c for c in value if not (c.isalnum() or c == "_" or c in symbols)), "?")
        raise ValidationError(
            path, f"{value!r} has invalid character {bad!r} (expected letters, digits or {symbols!r})")


def validate_path(value: str, path: str, min_len: int, max_len: int) -> None:
    validate_token(value, path, min_len, max_len, PATH_SYMBOLS)
    if value.startswith("/"):
        raise ValidationError(path, f"{value!r} must not begin with '/'")
    parts = value.split("/")
    if value.endswith("/") or "" in parts or "." in parts or ".." in parts:
        raise ValidationError(path, f"{value!r} is not a clean path (no '//', '.', '..' or trailing '/')")


def validate_journal_name(name: str, path: str = "name") -> None:
    validate_path(name, path, JOURNAL_NAME_MIN, JOURNAL_NAME_MAX)
    # Stores keep quire's own objects (index manifests, health probes) under `.quire/`;
    # no journal may shadow them.
    if any(part.startswith(".") for part in name.split("/")):
        raise ValidationError(path, f"{name!r}: a path segment may not begin with '.'")


def validate_zone(zone: str, path: str = "zone") -> None:
    validate_token(zone, path, ZONE_MIN, ZONE_MAX, "-_+.")


def validate_suffix(suffix: str, path: str = "suffix") -> None:
    validate_token(suffix, path, SUFFIX_MIN, SUFFIX_MAX, "-_+.")
