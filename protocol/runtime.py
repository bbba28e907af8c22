"""Process-wide runtime settings for quire's long-lived server processes.

A coordinator allocates a few small objects per frame (messages, futures, buffers) and
keeps a large, stable heap (specs, routes, metrics, imported modules). With CPython's
default thresholds (700 allocations per young collection) the cyclic collector runs
thousands of times a second under load and its older generations walk that stable heap
again and again: 3-4 % of a TLS coordinator's CPU in `gc_collect_main` and its visitors
(`perf record` of `python -m bench.secure`, docs/benchmarks.md round 7). So once start-up
is done the heap so far is frozen (never scanned again: `gc.freeze`) and young
collections run every GEN0_THRESHOLD allocations. Reference cycles are still collected;
they only live a little longer.
"""

from __future__ import annotations

import gc

__all__ = ["GEN0_THRESHOLD", "tune_gc_for_server"]

GEN0_THRESHOLD = 20_000
"""Net container allocations between two young-generation collections (CPython: 700)."""


def tune_gc_for_server() -> None:
    """Freeze the start-up heap and raise the young-generation threshold (idempotent)."""
    gc.collect()
    gc.freeze()
    g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(max(g0, GEN0_THRESHOLD), g1, g2)
