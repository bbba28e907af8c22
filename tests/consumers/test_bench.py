"""`python -m bench.consumer` runs end to end (small: the figure itself is not a test)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(90)


async def test_bench_consumer_small() -> None:
    from bench.consumer import run

    out = await run(5000, rounds=1)
    assert out["messages"] == 5000 and out["commits"] >= 1
    assert out["reference_msgs_per_s"] > 0 and out["count_msgs_per_s"] > 0 and out["ratio"] > 0
