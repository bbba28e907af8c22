"""protocol/runtime.py: the server processes' allocator settings."""

from __future__ import annotations

import ctypes.util
import os

import pytest

from protocol.runtime import tune_malloc_for_server

MIB = 1 << 20


def _minor_faults() -> int:
    with open(f"/proc/{os.getpid()}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[7])


@pytest.mark.skipif(ctypes.util.find_library("c") is None or not os.path.exists("/proc/self/stat"),
                    reason="needs a C library and /proc")
def test_frame_sized_buffers_reuse_the_heap_once_tuned() -> None:
    """Several frame-sized buffers alive at once, then all freed, round after round (a
    coordinator's large appends in flight): once tuned, later rounds reuse the heap's
    pages instead of faulting fresh ones in (glibc's default trims the freed top and
    faults ~256 pages per MiB again each round)."""
    assert tune_malloc_for_server() is True
    frame = memoryview(os.urandom(MIB))
    rounds = []
    for _ in range(12):
        before = _minor_faults()
        # Copies out of a receive buffer, as take_run and a replica's _sink make them
        # (not bytes(n): calloc'd fresh pages are never touched).
        held = [bytes(frame[:]) for _ in range(6)]
        del held
        rounds.append(_minor_faults() - before)
    later = sorted(rounds[4:])
    # 6 MiB of fresh pages are ~1,536 faults a round (glibc's defaults: measured 1,504
    # every round); a reused heap faults none of them (a few for the interpreter's own
    # small allocations).
    assert later[len(later) // 2] < 200, rounds
