"""Prometheus metrics of the coordinator's hot path (`quire_` prefix).

Successful appends are counted in `HOT` (plain numbers) and folded into
quire_appends_total{status="OK"}, quire_append_bytes_total,
quire_append_latency_seconds, quire_appends_whole_total and quire_lane_commits_total at
scrape time; every other figure is a metric updated in place."""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server


class HotPath:
    """Per-append figures of successful appends, kept as plain numbers by the event
    loop and folded into the Prometheus metrics below when they are scraped.

    A Counter.inc or Histogram.observe takes a lock and runs Python (~4.5 us per
    append for the three of them on the bench VM); these are integer adds. This
    collector is registered before the metrics it feeds, so every scrape folds the
    pending figures in first and reads exact totals. Thread-safe without a lock: the
    loop thread only adds to its totals, the scraping thread only reads them and
    keeps what it already folded in, so nothing is ever reset under a writer.
    """

    __slots__ = ("ok", "bytes", "lat_counts", "lat_sum", "whole", "commits", "_bounds", "_done")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.ok = 0
        self.bytes = 0
        self._bounds = bounds
        self.lat_counts = [0] * len(bounds)
        self.lat_sum = 0.0
        self.whole = 0
        """Of them, appends the whole-append lane served (append_lane.py)."""
        self.commits = 0
        """Commits the lane sent: each covers the lane appends of one loop turn."""
        self._done: tuple[int, int, list[int], float, int, int] = \
            (0, 0, [0] * len(bounds), 0.0, 0, 0)

    def appended(self, nbytes: int, latency: float, whole: bool = False) -> None:
        """One append answered OK: `nbytes` committed, `latency` seconds since its
        request; `whole`: served by the whole-append lane."""
        self.ok += 1
        self.whole += whole
        self.bytes += nbytes
        self.lat_counts[bisect_left(self._bounds, latency)] += 1
        self.lat_sum += latency

    def fold(self) -> None:
        """Add what happened since the last fold to the Prometheus metrics."""
        ok, nbytes, lat_sum, whole, commits = (self.ok, self.bytes, self.lat_sum, self.whole,
                                               self.commits)
        counts = list(self.lat_counts)
        done_ok, done_bytes, done_counts, done_sum, done_whole, done_commits = self._done
        if ok != done_ok:
            APPENDS.labels("OK").inc(ok - done_ok)
        if nbytes != done_bytes:
            APPEND_BYTES.inc(nbytes - done_bytes)
        for i, (c, d) in enumerate(zip(counts, done_counts)):
            if c != d:
                APPEND_LATENCY._buckets[i].inc(c - d)  # noqa: SLF001 - observe() without the per-value loop
        if lat_sum != done_sum:
            APPEND_LATENCY._sum.inc(lat_sum - done_sum)  # noqa: SLF001
        if whole != done_whole:
            APPENDS_WHOLE.inc(whole - done_whole)
        if commits != done_commits:
            LANE_COMMITS.inc(commits - done_commits)
        self._done = (ok, nbytes, counts, lat_sum, whole, commits)

    def collect(self):  # noqa: ANN201 - the prometheus Collector protocol
        self.fold()
        return []


LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
HOT = HotPath((*LATENCY_BUCKETS, float("inf")))
REGISTRY.register(HOT)  # first: a scrape folds the pending figures in before reading them

APPEND_BYTES = Counter("quire_append_bytes_total", "Bytes committed by appends served as primary.")
APPENDS = Counter("quire_appends_total", "Append RPCs finished, by status.", ["status"])
APPEND_LATENCY = Histogram(
    "quire_append_latency_seconds", "Append RPC latency (request to acknowledgement).",
    buckets=LATENCY_BUCKETS)
APPENDS_WHOLE = Counter("quire_appends_whole_total",
                        "Successful appends served by the whole-append lane (a plain append "
                        "that arrived whole on an idle synchronized pipeline; the rest took "
                        "the append FSM).")
LANE_COMMITS = Counter("quire_lane_commits_total",
                       "Commits sent by the whole-append lane: each covers the lane appends "
                       "of one journal in one event-loop turn (group commit), so "
                       "quire_appends_whole_total / this is the mean appends per commit.")
APPENDS_IN_FLIGHT = Gauge("quire_appends_in_flight", "Append RPCs currently being served.")
PIPELINE_REBUILDS = Counter("quire_pipeline_rebuilds_total", "Replication pipelines (re)built.")
SPOOL_BYTES = Gauge("quire_spool_bytes", "Committed bytes in open spools plus closed local fragments.")
SPOOL_WRITE_ERRORS = Counter("quire_spool_write_errors_total",
                             "Spool writes that failed, by reason (enospc, edquot, eio, erofs, "
                             "other): each refused the append it could not write "
                             "(spool_health.py).", ["reason"])
SPOOL_HEALTH = Gauge("quire_spool_health", "The spool's health: 0 ok, 1 full (appends refused "
                     "until room returns), 2 failed (journals moved away).")
READBACK_FAILURES = Counter("quire_fragment_readback_failures_total",
                            "Closed local fragments that could not be read back whole for a "
                            "persist worker, by reason (length, checksum, eio, other): each "
                            "copy was dropped as lost here, never uploaded (readback.py).",
                            ["reason"])
STALE_FRAGMENTS = Counter("quire_stale_fragments_dropped_total",
                          "Fragments a former member closed and dropped instead of persisting "
                          "them: the journal's route holds other bytes at their offsets (a "
                          "tail a later epoch replaced, retired_check.py).")
REPLICAS = Gauge("quire_replicas", "Journal replicas hosted by this coordinator.")
RECONCILED = Counter("quire_hosting_reconciled_total",
                     "Journals the topology follower examined (hosting.py): a change costs "
                     "the journals it touched, a full pass every hosted one.")
ASYNCIO_TASKS = Gauge("quire_asyncio_tasks", "asyncio tasks alive in this coordinator (what "
                      "grows per journal or per connection: bench/scale.py reads it).")
READ_BYTES = Counter("quire_read_bytes_total", "Bytes served to readers.")
AUTH_REFUSALS = Counter("quire_auth_refusals_total",
                        "Connections (unauthorized: bad token) and requests (forbidden: "
                        "capability or scope) refused by the auth gate.", ["reason", "capability"])
APPENDS_ABORTED = Counter("quire_appends_aborted_total",
                          "Appends rolled back (client abort, disconnect, timeout, too slow).", ["reason"])

APPENDS_DEDUPLICATED = Counter("quire_appends_deduplicated_total",
                               "Identified appends answered with their original commit "
                               "(a re-sent transaction that had already committed).")
TLS_CERT_EXPIRY = Gauge("quire_tls_cert_expiry_timestamp_seconds",
                        "notAfter (unix s) of each TLS certificate this process serves or "
                        "presents, by use (server, ca) and file.", ["use", "path"])


def watch_cert(use: str, path: str | None) -> None:
    """Export the notAfter of the certificate at `path` (nothing without one)."""
    if not path:
        return
    from protocol.logs import get_logger
    from protocol.tls import cert_not_after

    try:
        not_after = cert_not_after(path)
    except ValueError as exc:  # no series: a 0 would read as long expired
        get_logger(__name__).warning("certificate expiry not exported", error=str(exc))
        return
    TLS_CERT_EXPIRY.labels(use, path).set(not_after)


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve /metrics on a daemon thread (prometheus_client's own server)."""
    start_http_server(port, addr=addr)
