"""bench/calls.py counts calls per operation exactly, for a known operation."""

from __future__ import annotations

import asyncio

from bench.calls import count_calls


def _leaf(x: int) -> int:
    return x + 1


def test_count_calls_counts_python_and_c_calls_per_operation() -> None:
    async def op(task: int) -> None:
        _leaf(task)
        _leaf(task)
        len("abc")

    async def run() -> dict:
        return await count_calls(op, 1000, 4, top=10)

    res = asyncio.run(run())
    top = dict(res["top"])
    assert res["appends"] == 1000
    [leaf] = [k for name, k in top.items() if name.endswith("(_leaf)")]
    assert leaf == 2.0
    assert top["<len>"] >= 1.0
    # op's own frame, its two _leaf calls and the driver's per-op share, at least.
    assert res["python_calls_per_append"] >= 3.0
    assert abs(res["calls_per_append"] - res["python_calls_per_append"]
               - res["c_calls_per_append"]) <= 0.11
