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

Large appends allocate a frame-sized buffer per content frame (the primary's copy of a
client's chunk, a replica's of each content frame: up to MAX_FRAME, ~1 MiB) and several
are alive at once (appends in flight, the spool's writer thread, peer sockets). glibc's
dynamic thresholds trim the heap's top once ~2 MiB of it is free, so the next such
buffer comes from fresh pages again: a `brk` and 256 page faults per MiB, ~2.5 % of a
coordinator's CPU on 1 MiB appends (`perf record` of `python -m bench.cpu --size 1048576
--conc 8 --fresh --perf DIR`, docs/benchmarks.md). `tune_malloc_for_server` serves
frames from the heap (mmap only above MMAP_THRESHOLD) and keeps up to TRIM_THRESHOLD of
freed heap for the next ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["GEN0_THRESHOLD", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_gc_for_server",
           "tune_malloc_for_server"]

GEN0_THRESHOLD = 20_000
"""Net container allocations between two young-generation collections (CPython: 700)."""
MMAP_THRESHOLD = 4 << 20
"""Allocations from this size up get their own mapping (every frame is below it)."""
TRIM_THRESHOLD = 32 << 20
"""Free memory at the heap's top kept for reuse before it is returned to the kernel."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameters (malloc.h)."""


def tune_gc_for_server() -> None:
    """Freeze the start-up heap and raise the young-generation threshold (idempotent)."""
    gc.collect()
    gc.freeze()
    g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(max(g0, GEN0_THRESHOLD), g1, g2)


def tune_malloc_for_server() -> bool:
    """Fix glibc's mmap and trim thresholds (module docstring); False, changing nothing,
    where the C library is not glibc (no `mallopt`) or refuses a value."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) \
        and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
