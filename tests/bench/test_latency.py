"""bench/latency.py: bounded-memory percentiles against exact sorted-list percentiles."""

from __future__ import annotations

import math
import random

import pytest

from bench.latency import BUCKETS, MAX_NS, LatencyHistogram, _bounds, _index


def exact(values_ns: list[int], q: float) -> int:
    s = sorted(values_ns)
    return s[max(1, math.ceil(q * len(s))) - 1]


def test_buckets_tile_the_range_without_gaps() -> None:
    prev_high = 0
    for i in range(BUCKETS):
        low, high = _bounds(i)
        assert low == prev_high, i
        assert high > low
        assert (high - low) <= max(1, low / 128), i  # at most 1/128 of its values wide
        assert _index(low) == i and _index(high - 1) == i
        prev_high = high
    assert prev_high == MAX_NS + 1
    assert _index(MAX_NS * 10) == BUCKETS - 1 and _index(-5) == 0


@pytest.mark.parametrize("dist", ["uniform", "lognormal", "bimodal"])
def test_percentiles_within_one_bucket_of_exact(dist: str) -> None:
    rng = random.Random(7)
    if dist == "uniform":
        values = [rng.randint(1, 5_000_000) for _ in range(20_000)]
    elif dist == "lognormal":
        values = [int(rng.lognormvariate(12, 1.5)) for _ in range(20_000)]
    else:
        values = [rng.randint(50_000, 60_000) if rng.random() < 0.985 else rng.randint(9_000_000, 10_000_000)
                  for _ in range(20_000)]
    h = LatencyHistogram()
    for v in values:
        h.record(v / 1e9)
    assert h.n == len(values)
    assert h.min_ns == min(values) and h.max_ns == max(values)
    for q in (0.5, 0.9, 0.99, 0.999, 1.0):
        want = exact(values, q)
        got = h.percentile_ns(q)
        assert abs(got - want) <= max(1.0, want / 128), (q, got, want)


def test_p99_sees_the_tail() -> None:
    h = LatencyHistogram()
    for _ in range(98):
        h.record(0.001)
    for _ in range(2):
        h.record(0.5)
    s = h.summary()
    assert s["p50_ms"] == pytest.approx(1.0, rel=0.01)
    assert s["p99_ms"] == pytest.approx(500.0, rel=0.01)
    assert s["max_ms"] == pytest.approx(500.0)


def test_empty_and_merge() -> None:
    h = LatencyHistogram()
    assert math.isnan(h.percentile_ms(0.5)) and math.isnan(h.summary()["max_ms"])
    a, b = LatencyHistogram(), LatencyHistogram()
    for v in range(1, 1001):
        (a if v % 2 else b).record(v / 1e6)
    a.merge(b)
    a.merge(LatencyHistogram())
    assert a.n == 1000 and a.min_ns == 1000 and a.max_ns == 1_000_000
    assert a.percentile_ns(0.5) == pytest.approx(500_000, rel=1 / 128)


def test_memory_is_bounded() -> None:
    h = LatencyHistogram()
    for i in range(200_000):
        h.record((i % 997) * 1e-5)
    assert len(h.counts) == BUCKETS and h.n == 200_000
