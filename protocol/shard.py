"""Shard specifications: what etcd stores under `<root>/shards/<id>` (Gazette's ShardSpec).

A shard is one unit of stateful consumption: it reads its sources (journals named
outright, or every journal a label selector matches), keeps its state in a local store
whose every committed write batch is appended to its **recovery log** journal
(`<recovery_log_prefix>/<id>`), and is processed by exactly one primary at a time.

    id: counts/part-000
    sources:
      - journal: clicks/part-000
        min_offset: 0
      - selector: "topic=orders"
    recovery_log_prefix: recovery/counts
    hot_standbys: 1
    labels: {app: counts}
    checkpoint_interval: 1.0

Validation raises ValidationError naming the field (`sources[1].selector`), like
JournalSpec. Durations are seconds (floats).
"""

from __future__ import annotations

import enum

import msgspec

from .errors import ValidationError
from .labels import LabelSelector, LabelSet, parse_selector
from .names import validate_journal_name, validate_path

SHARD_ID_MIN, SHARD_ID_MAX = 1, 256
MAX_SOURCES = 1024
MAX_HOT_STANDBYS = 4
MIN_CHECKPOINT, MAX_CHECKPOINT = 0.01, 3600.0

__all__ = [
    "ShardSource",
    "ShardSpec",
    "ShardState",
    "ShardStatus",
    "SourceStatus",
    "validate_shard_id",
]


def validate_shard_id(shard_id: str, path: str = "id") -> None:
    """A clean path (it becomes an etcd key, a journal suffix and a directory name)."""
    validate_path(shard_id, path, SHARD_ID_MIN, SHARD_ID_MAX)
    if any(part.startswith(".") for part in shard_id.split("/")):
        raise ValidationError(path, f"{shard_id!r}: a path segment may not begin with '.'")


class ShardSource(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One source: exactly one of `journal` or `selector` (label selector text)."""

    journal: str = ""
    selector: str = ""
    min_offset: int = 0
    """Never read below this offset (a new shard starts here, not at 0)."""

    def validate(self, path: str = "source") -> None:
        if bool(self.journal) == bool(self.selector):
            raise ValidationError(path, "set exactly one of 'journal' or 'selector'")
        if self.journal:
            validate_journal_name(self.journal, f"{path}.journal")
        else:
            try:
                parse_selector(self.selector)
            except ValidationError as exc:
                raise ValidationError(f"{path}.selector", exc.reason) from None
        if self.min_offset < 0:
            raise ValidationError(f"{path}.min_offset", f"{self.min_offset} must be >= 0")

    def parsed_selector(self) -> LabelSelector | None:
        return parse_selector(self.selector) if self.selector else None


class ShardSpec(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    sources: tuple[ShardSource, ...] = ()
    recovery_log_prefix: str = "recovery"
    """The recovery log is the journal `<recovery_log_prefix>/<id>`."""
    hot_standbys: int = 0
    labels: LabelSet = LabelSet()
    disable: bool = False
    """A disabled shard has no primary: its current one releases it."""
    checkpoint_interval: float = 1.0
    """Commit a transaction at least this often while messages flow (seconds)."""

    @property
    def recovery_log(self) -> str:
        return f"{self.recovery_log_prefix}/{self.id}"

    def validate(self, path: str = "") -> None:
        def at(field: str) -> str:
            return f"{path}.{field}" if path else field

        validate_shard_id(self.id, at("id"))
        if not self.sources:
            raise ValidationError(at("sources"), "a shard needs at least one source")
        if len(self.sources) > MAX_SOURCES:
            raise ValidationError(at("sources"), f"{len(self.sources)} sources; at most {MAX_SOURCES}")
        seen: dict[str, int] = {}
        for i, source in enumerate(self.sources):
            where = at(f"sources[{i}]")
            source.validate(where)
            key = source.journal or f"selector:{source.selector}"
            if key in seen:
                raise ValidationError(where, f"duplicates sources[{seen[key]}] ({key})")
            seen[key] = i
        validate_journal_name(self.recovery_log_prefix, at("recovery_log_prefix"))
        try:
            validate_journal_name(self.recovery_log, at("recovery_log_prefix"))
        except ValidationError as exc:
            raise ValidationError(at("recovery_log_prefix"),
                                  f"recovery log {self.recovery_log!r} is not a journal name: "
                                  f"{exc.reason}") from None
        if self.recovery_log in seen:
            raise ValidationError(at("recovery_log_prefix"),
                                  f"recovery log {self.recovery_log!r} is also a source")
        if not (0 <= self.hot_standbys <= MAX_HOT_STANDBYS):
            raise ValidationError(at("hot_standbys"),
                                  f"{self.hot_standbys} out of range [0, {MAX_HOT_STANDBYS}]")
        self.labels.validate(at("labels"))
        if not (MIN_CHECKPOINT <= self.checkpoint_interval <= MAX_CHECKPOINT):
            raise ValidationError(at("checkpoint_interval"),
                                  f"{self.checkpoint_interval}s out of range "
                                  f"[{MIN_CHECKPOINT}, {MAX_CHECKPOINT}]")


class ShardState(str, enum.Enum):
    """What a member is doing with a shard (Gazette's ReplicaStatus codes)."""

    IDLE = "IDLE"
    BACKFILL = "BACKFILL"
    """Restoring: fetching a snapshot and replaying the recovery log."""
    STANDBY = "STANDBY"
    """Tailing the recovery log, ready to take over."""
    PRIMARY = "PRIMARY"
    FAILED = "FAILED"


class SourceStatus(msgspec.Struct, frozen=True, kw_only=True):
    journal: str
    offset: int
    """Read-through offset: every message before it is reflected in the committed state."""
    write_head: int = 0
    """The journal's write head when last observed (lag = write_head - offset)."""

    @property
    def lag(self) -> int:
        return max(0, self.write_head - self.offset)


class ShardStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Published by a member at `<root>/shard-status/<id>/<zone>#<suffix>` (its lease)."""

    id: str
    member: str
    state: ShardState
    sources: tuple[SourceStatus, ...] = ()
    log_offset: int = 0
    """The recovery log's offset through which the member's store is current."""
    transactions: int = 0
    message: str = ""
    """Why a shard FAILED."""
    updated: float = 0.0
    """Unix time of the report."""
