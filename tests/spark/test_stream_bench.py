"""bench.stream's comparison on a small store: the streaming pass reads exactly the rows
the batch read does, in several micro-batches (the figures come from `python -m bench.stream`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_stream_and_batch_read_the_same_rows(quire_spark: Any, tmp_path: Path) -> None:
    from bench.stream import compare, populate
    from fragment_store import open_store

    url = f"file://{tmp_path}/store/"
    populate(open_store(url), 2, 1, 0.125)
    result = compare(quire_spark, url, str(tmp_path), max_bytes=256 << 10, repeat=1)
    assert result["rows"] > 1000
    assert result["micro_batches"] >= 4  # 1 MiB in 256 KiB micro-batches
    assert result["batch_rows_s"] > 0 and result["stream_rows_s"] > 0
