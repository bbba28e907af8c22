"""Driver side: which journals a read covers, and their fragment indexes.

Journals come from the `journal` option, or from a label `selector` matched against
journal specs. Specs are read from etcd when the `etcd` option is given; otherwise from
the store alone — the journals named by index manifests (`.quire/index/<j>/manifest.json`)
and by fragment keys in a listing — where a journal's labels are its manifest's
`labels` if the manifest carries them, plus the `name` and `prefix` meta-labels (so
`prefix=topics/clicks/` selects a topic laid out Gazette-style as a directory).

A journal's index is the covering set (fragment_store.CoverSet) of a listing of its
fragments (`index=listing`, authoritative, the default) or its manifest
(`index=manifest`, no listing; falls back to a listing when there is none).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from protocol import Fragment, JournalSpec, LabelSelector, LabelSet, QuireError

from .options import OptionError, ReadOptions
from .planner import Span, plan

log = logging.getLogger(__name__)

MANIFEST_PREFIX = ".quire/index/"
MANIFEST_NAME = "manifest.json"
_FRAGMENT_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{40}(\.[A-Za-z]+)?")


class NoJournals(QuireError):
    """The selector matched no journal (or a named journal has no fragments)."""


def open_read_store(opts: ReadOptions) -> Any:
    from fragment_store import open_store

    return open_store(opts.store, **opts.store_options)


def _journal_of_key(key: str) -> str | None:
    """The journal a fragment key belongs to, assuming Hive-style (`k=v`) path postfixes."""
    parts = key.split("/")
    if len(parts) < 2 or not _FRAGMENT_NAME.fullmatch(parts[-1]) or parts[0].startswith("."):
        return None
    dirs = parts[:-1]
    while dirs and "=" in dirs[-1]:
        dirs.pop()
    return "/".join(dirs) or None


def _selector_prefixes(selector: LabelSelector | None) -> list[str]:
    """Listing prefixes implied by `prefix=` (or `name=`) includes: a narrower listing."""
    if selector is None:
        return [""]
    prefixes = selector.include.values("prefix")
    names = selector.include.values("name")
    if prefixes and all(prefixes):
        return sorted(set(prefixes))
    if names and all(names):
        return sorted({n + "/" for n in names})
    return [""]


def store_journals(store: Any, selector: LabelSelector | None) -> dict[str, LabelSet]:
    """Journals found in the store (manifests, then fragment keys) with their labels."""
    from fragment_store import read_manifest

    found: dict[str, LabelSet] = {}
    for info in store.list(MANIFEST_PREFIX):
        rest = info.key[len(MANIFEST_PREFIX):]
        if rest.endswith("/" + MANIFEST_NAME):
            found[rest[:-len(MANIFEST_NAME) - 1]] = LabelSet()
    for journal in list(found):
        labels = None
        try:
            labels = getattr(read_manifest(store, journal), "labels", None)
        except QuireError as exc:
            log.warning("unreadable manifest of %s: %s", journal, exc)
        found[journal] = labels if isinstance(labels, LabelSet) else LabelSet()
    for prefix in _selector_prefixes(selector):
        for info in store.list(prefix):
            journal = _journal_of_key(info.key)
            if journal is not None:
                found.setdefault(journal, LabelSet())
    return found


def etcd_specs(endpoint: str, root: str,
               tls: tuple[str, str, str] = ("", "", "")) -> dict[str, LabelSet]:
    """Journal specs under `<root>/journals/` in etcd (`host:port`, or `https://…` with
    `tls` = (CA, client certificate, key) files), as name -> labels."""
    import asyncio

    import msgspec

    async def fetch() -> list[tuple[bytes, bytes]]:
        from topology.etcd import client_for
        from topology.etcd_client import EtcdTLS

        ca, cert, key = tls
        client = client_for(endpoint, tls=EtcdTLS(ca, cert or None, key or None) if ca else None)
        try:
            prefix = f"{root}/journals/".encode()
            result = await client.get_prefix(prefix)
            return [(kv.key, kv.value) for kv in result]
        finally:
            await client.close()

    try:
        pairs = asyncio.run(fetch())
    except Exception as exc:  # noqa: BLE001 - any client failure is a bad option here
        raise OptionError("etcd", f"cannot read journal specs from {endpoint}: {exc}") from None
    decoder = msgspec.json.Decoder(JournalSpec)
    out: dict[str, LabelSet] = {}
    for key, value in pairs:
        try:
            spec = decoder.decode(value)
        except msgspec.DecodeError as exc:
            log.warning("skipping malformed spec %s: %s", key, exc)
            continue
        if spec.readable:
            out[spec.name] = spec.labels
    return out


def resolve_journals(opts: ReadOptions, store: Any | None = None) -> list[str]:
    """The journals a read covers, sorted."""
    journals = set(opts.journals)
    selector = opts.label_selector
    if selector is not None:
        if opts.etcd:
            candidates = etcd_specs(opts.etcd, opts.etcd_root, opts.etcd_tls)
        else:
            candidates = store_journals(store or open_read_store(opts), selector)
        journals.update(j for j, labels in candidates.items()
                        if selector.matches_journal(j, labels))
    return sorted(journals)


def load_index(store: Any, journal: str, source: str = "listing") -> list[Fragment]:
    """A journal's covering set from the store."""
    from fragment_store import CoverSet, FragmentNotFound, list_fragments, read_manifest

    if source == "manifest":
        try:
            return list(read_manifest(store, journal).fragments)
        except FragmentNotFound:
            log.info("no manifest for %s; listing the store", journal)
    return list(CoverSet(list_fragments(store, journal)))


def load_indexes(opts: ReadOptions) -> dict[str, list[Fragment]]:
    store = open_read_store(opts)
    journals = resolve_journals(opts, store)
    if not journals:
        raise NoJournals(f"selector {opts.selector!r} matched no journal in {opts.store}")
    return {j: load_index(store, j, opts.index) for j in journals}


def plan_read(opts: ReadOptions) -> list[Span]:
    """Every span of a read, in (journal, offset) order."""
    spans: list[Span] = []
    for journal, fragments in sorted(load_indexes(opts).items()):
        spans.extend(plan(fragments, **opts.plan_kwargs()))
    return spans
