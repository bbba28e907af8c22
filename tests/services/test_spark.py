"""PySpark runs on the machine's JVM in local mode."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_small_dataframe(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame(
        [("a/1", 0, 10), ("a/1", 10, 25), ("b/2", 0, 5)], ["journal", "begin", "end"]
    )
    sizes = {
        row["journal"]: row["bytes"]
        for row in df.selectExpr("journal", "end - begin AS bytes")
        .groupBy("journal")
        .sum("bytes")
        .withColumnRenamed("sum(bytes)", "bytes")
        .collect()
    }
    assert sizes == {"a/1": 25, "b/2": 5}
