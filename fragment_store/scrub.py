"""Scrubbing: prove every persisted fragment of a journal, at a bounded rate.

The block scanner of this system. `scrub_journal(journal, stores)` lists each of the
journal's stores and proves every fragment object found there by its SHA-1
(`verified.verify_stored`). A copy that fails is reported (metrics and a log line in
`verified`) and, with `repair`, handed to `read_verified` with the journal's other
stores: the rotten object is quarantined and mended from a good copy where one exists,
and copied aside (kept in place, failing every read loudly) where none does.

`rate` caps the content bytes proven per second (0 = unlimited) — a scrub shares the
stores with persistence and must never starve it. `progress(fragment, nbytes)` is
called after each fragment (for a progress bar or metrics).

Both the workers' beat task (workers/scrub.py) and `quire fragments verify` use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from protocol import Fragment

from .errors import StoreError
from .keys import fragment_key
from .persist import list_fragments
from .stores.base import FragmentStore
from .verified import FragmentCorrupt, read_verified, verify_stored


@dataclass
class Finding:
    """One stored copy that failed its proof."""

    journal: str
    store: str
    key: str
    reason: str
    mended: bool = False
    """A good copy was found in another store and written back under the key."""

    def __str__(self) -> str:
        fate = "mended from a good copy" if self.mended else "NO good copy"
        return f"{self.store}{self.key}: {self.reason} ({fate})"


@dataclass
class ScrubReport:
    fragments: int = 0
    bytes: int = 0
    findings: list[Finding] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    """Objects the store would not serve (a StoreError other than corruption)."""

    @property
    def corrupt(self) -> list[Finding]:
        return [f for f in self.findings if not f.mended]

    def add(self, other: ScrubReport) -> None:
        self.fragments += other.fragments
        self.bytes += other.bytes
        self.findings += other.findings
        self.unreadable += other.unreadable


class RateLimit:
    """Sleeps so that the bytes counted stay at or under `rate` per second on average."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate, self.clock, self.sleep = rate, clock, sleep
        self.started = clock()
        self.done = 0

    def spend(self, nbytes: int) -> None:
        self.done += nbytes
        if self.rate <= 0:
            return
        ahead = self.done / self.rate - (self.clock() - self.started)
        if ahead > 0:
            self.sleep(ahead)


def journal_fragments(journal: str, stores: Sequence[str],
                      open_store: Callable[[str], FragmentStore]) -> list[tuple[FragmentStore, Fragment]]:
    """Every (store, fragment object) of `journal` in its stores."""
    out = []
    for url in stores:
        store = open_store(url)
        out += [(store, f) for f in list_fragments(store, journal)]
    return out


def scrub_journal(journal: str, stores: Sequence[str], *,
                  open_store: Callable[[str], FragmentStore],
                  rate: float = 0, repair: bool = True,
                  limit: RateLimit | None = None,
                  objects: list[tuple[FragmentStore, Fragment]] | None = None,
                  progress: Callable[[Fragment, int], None] | None = None) -> ScrubReport:
    """Prove every fragment object of `journal` in `stores` (see the module doc)."""
    limit = limit or RateLimit(rate)
    report = ScrubReport()
    for store, frag in objects if objects is not None else journal_fragments(journal, stores, open_store):
        try:
            why = verify_stored(store, frag, report=not repair)
        except StoreError as exc:
            report.unreadable.append(f"{store.url}{fragment_key(frag)}: {exc}")
            why = ""
        if why:
            finding = Finding(journal, store.url, fragment_key(frag), why)
            if repair:
                try:
                    read_verified(frag, store=store, stores=stores, open_store=open_store).close()
                    finding.mended = True
                except FragmentCorrupt:
                    pass
                except StoreError as exc:
                    finding.reason += f"; repair failed: {exc}"
            report.findings.append(finding)
        report.fragments += 1
        report.bytes += frag.content_length
        limit.spend(frag.content_length)
        if progress is not None:
            progress(frag, frag.content_length)
    return report
