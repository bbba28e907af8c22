"""Prometheus metrics of the coordinator's hot path (`quire_` prefix)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

APPEND_BYTES = Counter("quire_append_bytes_total", "Bytes committed by appends served as primary.")
APPENDS = Counter("quire_appends_total", "Append RPCs finished, by status.", ["status"])
APPEND_LATENCY = Histogram(
    "quire_append_latency_seconds", "Append RPC latency (request to acknowledgement).",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
APPENDS_IN_FLIGHT = Gauge("quire_appends_in_flight", "Append RPCs currently being served.")
PIPELINE_REBUILDS = Counter("quire_pipeline_rebuilds_total", "Replication pipelines (re)built.")
SPOOL_BYTES = Gauge("quire_spool_bytes", "Committed bytes in open spools plus closed local fragments.")
REPLICAS = Gauge("quire_replicas", "Journal replicas hosted by this coordinator.")
READ_BYTES = Counter("quire_read_bytes_total", "Bytes served to readers.")
AUTH_REFUSALS = Counter("quire_auth_refusals_total",
                        "Connections (unauthorized: bad token) and requests (forbidden: "
                        "capability or scope) refused by the auth gate.", ["reason", "capability"])
APPENDS_ABORTED = Counter("quire_appends_aborted_total",
                          "Appends rolled back (client abort, disconnect, timeout, too slow).", ["reason"])

APPENDS_DEDUPLICATED = Counter("quire_appends_deduplicated_total",
                               "Identified appends answered with their original commit "
                               "(a re-sent transaction that had already committed).")


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve /metrics on a daemon thread (prometheus_client's own server)."""
    start_http_server(port, addr=addr)
