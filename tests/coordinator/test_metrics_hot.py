"""The hot-path figures (metrics.HOT) reach Prometheus exactly, once, at scrape time."""

from __future__ import annotations

from prometheus_client import REGISTRY

from coordinator import metrics


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    value = REGISTRY.get_sample_value(name, labels or {})
    return value or 0.0


def test_appends_fold_into_counters_and_histogram_once() -> None:
    ok0 = _sample("quire_appends_total", {"status": "OK"})
    bytes0 = _sample("quire_append_bytes_total")
    count0 = _sample("quire_append_latency_seconds_count")
    sum0 = _sample("quire_append_latency_seconds_sum")
    le1ms0 = _sample("quire_append_latency_seconds_bucket", {"le": "0.001"})
    inf0 = _sample("quire_append_latency_seconds_bucket", {"le": "+Inf"})
    whole0 = _sample("quire_appends_whole_total")

    metrics.HOT.appended(1024, 0.0007, whole=True)
    metrics.HOT.appended(0, 0.001)   # on a bucket's bound: that bucket (le is inclusive)
    metrics.HOT.appended(10, 30.0)   # past every finite bucket

    for _ in range(2):  # a second scrape adds nothing twice
        assert _sample("quire_appends_total", {"status": "OK"}) == ok0 + 3
        assert _sample("quire_append_bytes_total") == bytes0 + 1034
        assert _sample("quire_append_latency_seconds_count") == count0 + 3
        assert abs(_sample("quire_append_latency_seconds_sum") - (sum0 + 30.0017)) < 1e-9
        assert _sample("quire_append_latency_seconds_bucket", {"le": "0.001"}) == le1ms0 + 2
        assert _sample("quire_append_latency_seconds_bucket", {"le": "+Inf"}) == inf0 + 3
        assert _sample("quire_appends_whole_total") == whole0 + 1
