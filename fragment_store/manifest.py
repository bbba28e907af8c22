"""The index manifest batch readers use instead of listing the store.

Stored at `.quire/index/<journal>/manifest.json` relative to the store URL (no journal
segment starts with '.', so it cannot collide with fragments). Written by the index
refresh worker after each refresh; a single PUT / rename, so readers see a whole one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec

from protocol import Fragment, LabelSet, ValidationError, validate_journal_name

from .index import CoverSet
from .stores.base import FragmentStore

MANIFEST_VERSION = 1


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    journal: str
    fragments: tuple[Fragment, ...] = ()
    """The covering set, in offset order."""
    end_offset: int = 0
    updated: float = 0.0
    """Unix seconds of the refresh that wrote it."""
    version: int = MANIFEST_VERSION
    labels: LabelSet = LabelSet()
    """The journal spec's labels when it was written, so batch readers select journals
    by label from the store alone (manifests written before this field read as none)."""

    def cover_set(self) -> CoverSet:
        return CoverSet(self.fragments)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Manifest)


def manifest_key(journal: str) -> str:
    validate_journal_name(journal, "journal")
    return f".quire/index/{journal}/manifest.json"


def build_manifest(journal: str, fragments: Iterable[Fragment], now: float | None = None,
                   labels: LabelSet = LabelSet()) -> Manifest:
    cover = fragments if isinstance(fragments, CoverSet) else CoverSet(fragments)
    return Manifest(journal=journal, fragments=tuple(cover), end_offset=cover.end_offset,
                    updated=time.time() if now is None else now, labels=labels)


def encode_manifest(manifest: Manifest) -> bytes:
    return _ENCODER.encode(manifest)


def decode_manifest(data: bytes, journal: str | None = None) -> Manifest:
    try:
        manifest = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValidationError("manifest", f"malformed manifest: {exc}") from None
    if journal is not None and manifest.journal != journal:
        raise ValidationError("manifest.journal", f"{manifest.journal!r} is not {journal!r}")
    manifest.labels.validate("manifest.labels")
    for i, f in enumerate(manifest.fragments):
        f.validate(f"manifest.fragments[{i}]")
        if f.journal != manifest.journal:
            raise ValidationError(f"manifest.fragments[{i}].journal", "belongs to another journal")
    return manifest


def write_manifest(store: FragmentStore, journal: str, fragments: Iterable[Fragment],
                   now: float | None = None, labels: LabelSet = LabelSet()) -> Manifest:
    """Write the journal's manifest (replacing any previous one) and return it."""
    manifest = build_manifest(journal, fragments, now, labels)
    data = encode_manifest(manifest)
    store.put(manifest_key(journal), data, len(data))
    return manifest


def read_manifest(store: FragmentStore, journal: str) -> Manifest:
    """The journal's manifest; FragmentNotFound if none was written yet."""
    return decode_manifest(store.read_all(manifest_key(journal)), journal)
