"""Journal specifications: what etcd stores under `<root>/journals/<name>`.

Durations are seconds (floats). Bounds follow Gazette's journal_spec_extensions.go.
"""

from __future__ import annotations

import enum
import re

import msgspec

from .errors import ValidationError
from .fragment import Codec
from .labels import LabelSet
from .names import validate_journal_name, validate_path

MIN_FRAGMENT_LENGTH = 1 << 10
MAX_FRAGMENT_LENGTH = 1 << 34
MAX_REPLICATION = 5
MIN_REFRESH, MAX_REFRESH = 1.0, 24 * 3600.0
MIN_FLUSH = 60.0
STORE_SCHEMES = ("file", "s3")


class Flag(str, enum.Enum):
    READ_WRITE = "rw"
    READ_ONLY = "ro"
    WRITE_ONLY = "wo"


class SuspendLevel(str, enum.Enum):
    NONE = "none"
    PARTIAL = "partial"
    FULL = "full"


class Suspend(msgspec.Struct, frozen=True, kw_only=True):
    level: SuspendLevel = SuspendLevel.NONE
    offset: int = 0


class FragmentSpec(msgspec.Struct, frozen=True, kw_only=True):
    length: int = 1 << 27
    """Target uncompressed size of a fragment; the spool rolls past it."""
    compression_codec: Codec = Codec.GZIP
    stores: tuple[str, ...] = ()
    """Store URLs (`file:///dir/`, `s3://bucket/prefix/`). New fragments go to stores[0]."""
    refresh_interval: float = 60.0
    retention: float = 0.0
    """Age after which persisted fragments may be pruned; <= 0 keeps forever."""
    flush_interval: float = 0.0
    """Roll a non-empty spool at least this often (0 = only on length)."""
    path_postfix_template: str = ""
    """`str.format`-style template over utc fields, e.g. `date={utc:%Y-%m-%d}`."""

    def validate(self, path: str = "fragment") -> None:
        if not (MIN_FRAGMENT_LENGTH <= self.length <= MAX_FRAGMENT_LENGTH):
            raise ValidationError(f"{path}.length",
                                  f"{self.length} out of range [{MIN_FRAGMENT_LENGTH}, {MAX_FRAGMENT_LENGTH}]")
        for i, url in enumerate(self.stores):
            validate_store_url(url, f"{path}.stores[{i}]")
        if (self.compression_codec == Codec.GZIP_OFFLOAD_DECOMPRESSION and self.stores
                and self.stores[0].startswith("file:")):
            raise ValidationError(f"{path}.compression_codec",
                                  "gzip-offload needs an s3:// stores[0] (a file store cannot offload)")
        if not (MIN_REFRESH <= self.refresh_interval <= MAX_REFRESH):
            raise ValidationError(f"{path}.refresh_interval",
                                  f"{self.refresh_interval}s out of range [{MIN_REFRESH}, {MAX_REFRESH}]")
        if self.flush_interval != 0 and self.flush_interval < MIN_FLUSH:
            raise ValidationError(f"{path}.flush_interval",
                                  f"{self.flush_interval}s must be 0 or >= {MIN_FLUSH}s")
        if self.path_postfix_template:
            where = f"{path}.path_postfix_template"
            try:
                rendered = render_postfix(self.path_postfix_template, 0.0)
            except Exception as exc:  # any str.format failure (AttributeError too)
                raise ValidationError(where, f"does not render: {type(exc).__name__}: {exc}") from None
            # The postfix becomes part of every object key: it must not climb out of the
            # journal's prefix or shadow quire's `.quire/` objects.
            if rendered:
                validate_path(rendered, where, 1, 512)
                if any(part.startswith(".") for part in rendered.split("/")):
                    raise ValidationError(where, f"renders {rendered!r}: a segment may not begin with '.'")


class JournalSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    replication: int = 3
    labels: LabelSet = LabelSet()
    fragment: FragmentSpec = FragmentSpec()
    flags: Flag = Flag.READ_WRITE
    max_append_rate: int = 0
    """Bytes per second; 0 = unlimited."""
    suspend: Suspend = Suspend()

    @property
    def writable(self) -> bool:
        return self.flags != Flag.READ_ONLY

    @property
    def readable(self) -> bool:
        return self.flags != Flag.WRITE_ONLY

    def desired_replication(self) -> int:
        if self.suspend.level == SuspendLevel.FULL:
            return 0
        if self.suspend.level == SuspendLevel.PARTIAL:
            return 1
        return self.replication

    def validate(self, path: str = "") -> None:
        def at(field: str) -> str:
            return f"{path}.{field}" if path else field

        validate_journal_name(self.name, at("name"))
        if not (1 <= self.replication <= MAX_REPLICATION):
            raise ValidationError(at("replication"),
                                  f"{self.replication} out of range [1, {MAX_REPLICATION}]")
        self.labels.validate(at("labels"))
        self.fragment.validate(at("fragment"))
        if self.max_append_rate < 0:
            raise ValidationError(at("max_append_rate"), f"{self.max_append_rate} must be >= 0")
        if self.suspend.offset < 0:
            raise ValidationError(at("suspend.offset"), "must be >= 0")


_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


def validate_store_url(url: str, path: str = "store") -> None:
    """`file:///abs/dir/` or `s3://bucket/optional/prefix/`; must end in '/'."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in STORE_SCHEMES:
        raise ValidationError(path, f"{url!r}: expected a URL with scheme one of {STORE_SCHEMES}")
    if not url.endswith("/"):
        raise ValidationError(path, f"{url!r}: a store URL must end in '/'")
    host, _, rel = rest.partition("/")
    if scheme == "file":
        if host:
            raise ValidationError(path, f"{url!r}: a file:// URL has no host (use file:///abs/path/)")
        if ".." in rel.split("/"):
            raise ValidationError(path, f"{url!r}: '..' is not allowed")
    else:
        bucket = host.split("?")[0]
        if not _S3_BUCKET.fullmatch(bucket):
            raise ValidationError(path, f"{url!r}: {bucket!r} is not a valid S3 bucket name")
        if rel.startswith("/") or "//" in rel or ".." in rel.split("/"):
            raise ValidationError(path, f"{url!r}: prefix is not a clean path")


def render_postfix(template: str, unix_time: float) -> str:
    """Render a path-postfix template at a time, e.g. 'date={utc:%Y-%m-%d}/hour={utc:%H}'."""
    import datetime as _dt

    utc = _dt.datetime.fromtimestamp(unix_time, tz=_dt.timezone.utc)
    return template.format(utc=utc)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: str | float | int, path: str = "duration") -> float:
    """Seconds from `90`, `1.5`, `"10m"`, `"1h30m"`, `"250ms"`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        total, pos = 0.0, 0
        for m in _DURATION.finditer(text):
            if m.start() != pos:
                break
            total += float(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]
            pos = m.end()
        if pos == len(text) and text:
            return total
    raise ValidationError(path, f"{value!r} is not a duration (expected seconds or e.g. '10m', '1h30m')")
