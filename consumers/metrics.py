"""Prometheus metrics of consumer members (`quire_shard_*`, base units).

Labels are shard ids (bounded by the shards a member runs) and, for lag, source journals.
Served on 127.0.0.1:<--metrics-port> when `quire consumer run` is given one.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["LAG_BYTES", "MESSAGES", "REPLAY_BYTES", "SNAPSHOTS", "TXN_SECONDS", "TXNS"]

TXNS = Counter("quire_shard_transactions_total",
               "Transactions committed (recovery-log append + store write batch), by shard.",
               ["shard"])
TXN_SECONDS = Histogram("quire_shard_transaction_seconds",
                        "Commit latency: recovery-log append through the store write, by shard.",
                        ["shard"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5, 1.0, 2.5, 5.0))
MESSAGES = Counter("quire_shard_messages_total", "Messages handled by the app, by shard.", ["shard"])
LAG_BYTES = Gauge("quire_shard_lag_bytes",
                  "Source write head minus the shard's read-through offset, by shard and journal.",
                  ["shard", "journal"])
REPLAY_BYTES = Counter("quire_shard_recovery_replay_bytes_total",
                       "Recovery-log bytes replayed into the store (restore and standby tailing).",
                       ["shard"])
SNAPSHOTS = Counter("quire_shard_snapshots_total", "Store snapshots uploaded, by shard.", ["shard"])
