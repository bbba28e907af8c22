"""Latency percentiles in bounded memory: a fixed array of log-linear buckets.

Every system of the bench (quire, the minimal pipeline, Redis, Redis + WAIT, JetStream
with and without TLS) records each operation's time from send to acknowledgement at the
client here. A bench case of a million appends used to keep a million floats to sort;
this keeps 4,352 counters whatever the run's length (HdrHistogram's layout, two
significant digits and a bit):

  * values are integer nanoseconds; below 256 ns each value has its own bucket;
  * above, each power of two [2^k, 2^(k+1)) is split into 128 equal buckets, so a
    bucket is at most 1/128 of its values wide (a reported percentile is within 0.8 %
    of the exact one); the last power covers up to 2^40 ns (18 minutes), longer values
    count in the last bucket.

A percentile is the nearest-rank one (the smallest recorded value with at least q of the
values at or below it), reported as the middle of its bucket; min and max are exact.
"""

from __future__ import annotations

import math

__all__ = ["LatencyHistogram", "BUCKETS", "MAX_NS"]

_SUB = 128                      # buckets per power of two (above 256 ns)
_LINEAR = 2 * _SUB              # values below this have a bucket each
_MAX_SHIFT = 32                 # the last power of two: [2^39, 2^40) ns
BUCKETS = _LINEAR + _MAX_SHIFT * _SUB
MAX_NS = (1 << (_MAX_SHIFT + 8)) - 1


def _index(ns: int) -> int:
    if ns < _LINEAR:
        return ns if ns > 0 else 0
    if ns > MAX_NS:
        ns = MAX_NS
    shift = ns.bit_length() - 8                   # 1 .. _MAX_SHIFT
    return _LINEAR + (shift - 1) * _SUB + (ns >> shift) - _SUB


def _bounds(index: int) -> tuple[int, int]:
    """[low, high) of bucket `index`, in ns."""
    if index < _LINEAR:
        return index, index + 1
    shift, sub = divmod(index - _LINEAR, _SUB)
    shift += 1
    low = (sub + _SUB) << shift
    return low, low + (1 << shift)


class LatencyHistogram:
    """Counts of latencies (seconds in, milliseconds out) in BUCKETS fixed buckets."""

    __slots__ = ("counts", "n", "min_ns", "max_ns")

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.n = 0
        self.min_ns = 0
        self.max_ns = 0

    def record(self, seconds: float) -> None:
        ns = int(seconds * 1e9)
        self.counts[_index(ns)] += 1
        if self.n == 0 or ns < self.min_ns:
            self.min_ns = ns
        if ns > self.max_ns:
            self.max_ns = ns
        self.n += 1

    def merge(self, other: LatencyHistogram) -> None:
        if other.n == 0:
            return
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] += c
        self.min_ns = other.min_ns if self.n == 0 else min(self.min_ns, other.min_ns)
        self.max_ns = max(self.max_ns, other.max_ns)
        self.n += other.n

    def percentile_ns(self, q: float) -> float:
        """The q-quantile (0 < q ≤ 1) in ns; NaN with no values."""
        if self.n == 0:
            return float("nan")
        rank = max(1, math.ceil(q * self.n))
        if rank >= self.n:
            return float(self.max_ns)
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                low, high = _bounds(i)
                mid = (low + high - 1) / 2
                return min(max(mid, self.min_ns), self.max_ns)
        return float(self.max_ns)  # pragma: no cover - the counts sum to n

    def percentile_ms(self, q: float) -> float:
        return self.percentile_ns(q) / 1e6

    def summary(self) -> dict[str, float]:
        """`p50_ms`, `p99_ms` (and the exact max), as the bench's figures name them."""
        return {"p50_ms": self.percentile_ms(0.5), "p99_ms": self.percentile_ms(0.99),
                "max_ms": self.max_ns / 1e6 if self.n else float("nan")}
