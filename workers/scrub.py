"""Scrubbing the stores (queue `prune`): every persisted fragment proven once a period.

`sweep()` runs on beat every `QUIRE_WORKER_SCRUB_INTERVAL` (default one day: the
period within which every fragment is proven again). One pass walks every journal with
stores, in name order, and proves each fragment object in each of its stores by its
SHA-1 (fragment_store.scrub), at most `QUIRE_WORKER_SCRUB_RATE` content bytes per second
over the whole pass (default 8 MiB/s; 0 = unlimited), so it never starves persistence.
A rotten copy is reported, quarantined and mended from another store's good copy where
one exists (else copied aside and kept failing loudly; `quire fragments verify` names it).

Metrics (this worker's /metrics): `quire_scrub_bytes_total`, `quire_scrub_fragments_total`
(progress), `quire_scrub_corrupt_total{mended}` (findings),
`quire_scrub_last_pass_timestamp_seconds` and `quire_scrub_last_pass_corrupt` (the
corrupt copies without a good copy the last finished pass found), plus the readers'
`quire_fragment_corrupt_total{store}` from fragment_store.verified.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge

from fragment_store.scrub import RateLimit, ScrubReport, scrub_journal
from protocol.logs import get_logger
from workers import common
from workers.app import app
from workers.errors import MAINTENANCE_RETRY

__all__ = ["scrub_all", "sweep"]

log = get_logger(__name__)

SCRUB_BYTES = Counter("quire_scrub_bytes_total", "Fragment content bytes proven by the scrub.")
SCRUB_FRAGMENTS = Counter("quire_scrub_fragments_total", "Fragment objects proven by the scrub.")
SCRUB_CORRUPT = Counter("quire_scrub_corrupt_total",
                        "Rotten fragment copies the scrub found, by whether a good copy mended them.",
                        ["mended"])
LAST_PASS = Gauge("quire_scrub_last_pass_timestamp_seconds",
                  "When the last full scrub pass finished (unix seconds).", multiprocess_mode="max")
LAST_PASS_CORRUPT = Gauge("quire_scrub_last_pass_corrupt",
                          "Corrupt copies with no good copy anywhere, found by the last pass.",
                          multiprocess_mode="max")


def scrub_all(journals: dict[str, tuple[str, ...]], rate: float) -> ScrubReport:
    """One pass over `journals` (name -> store URLs), sharing one rate limit."""
    limit = RateLimit(rate)
    total = ScrubReport()
    for name in sorted(journals):
        def progress(_frag: Any, nbytes: int) -> None:
            SCRUB_BYTES.inc(nbytes)
            SCRUB_FRAGMENTS.inc()

        report = scrub_journal(name, journals[name], open_store=common.store, limit=limit,
                               progress=progress)
        for finding in report.findings:
            SCRUB_CORRUPT.labels(str(finding.mended).lower()).inc()
            log.error("scrub found a rotten fragment", journal=name, store=finding.store,
                      key=finding.key, reason=finding.reason, mended=finding.mended)
        total.add(report)
    LAST_PASS.set(time.time())
    LAST_PASS_CORRUPT.set(len(total.corrupt))
    return total


_PERIOD = app.conf.quire_worker.scrub_interval


@app.task(name="workers.scrub.sweep", bind=True, ignore_result=True, **MAINTENANCE_RETRY,
          time_limit=max(_PERIOD * 2, 600.0), soft_time_limit=max(_PERIOD * 1.9, 570.0))
def sweep(self: Any) -> dict[str, int]:
    """Beat, every QUIRE_WORKER_SCRUB_INTERVAL: one rate-limited pass over every store."""
    ws = common.worker_settings()
    with common.sweep_topology("scrub", ws.scrub_interval) as topo:
        if topo is None:
            log.info("another scrub pass is running; skipping")
            return {}
        journals = {n: tuple(jt.spec.fragment.stores) for n, jt in topo.journals.items()
                    if jt.spec.fragment.stores}
        report = scrub_all(journals, ws.scrub_rate)
        log.info("scrub pass", journals=len(journals), fragments=report.fragments,
                 bytes=report.bytes, findings=len(report.findings), corrupt=len(report.corrupt))
        return {"fragments": report.fragments, "bytes": report.bytes,
                "findings": len(report.findings), "corrupt": len(report.corrupt)}
