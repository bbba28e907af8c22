"""hourly-counts: messages and bytes per key per hour over JSON-lines journals.

Input: journals selected by a label selector (e.g. a topic: `prefix=topics/clicks/`),
each message a JSON object with a key field (`key`) and an ISO-8601 time (`ts`).
Output: Parquet at `--out`, partitioned by `date`, one row per (key, hour):
`key, hour (timestamp, UTC), messages (long), bytes (long: message bytes + delimiter),
journals (int: how many journals the key appeared in), first_offset/last_offset`.

    quire spark run hourly-counts --store file:///data/ --selector prefix=topics/clicks/ --out /tmp/out
    spark-submit --py-files build/quire-batch.zip spark/jobs/hourly_counts.py \\
        --store s3://bucket/quire/ --selector 'prefix=topics/clicks/' --out s3a://bucket/reports/
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark.jobs.common import JobParams, parse_argv, session

NAME = "hourly-counts"
DESCRIPTION = "messages and bytes per key per hour over JSON-lines journals, as Parquet"
SCHEMA = "journal string, offset bigint, value string, key string, ts timestamp"


def build(spark: Any, params: JobParams) -> Any:
    """The aggregate as a DataFrame (not yet written)."""
    from pyspark.sql import functions as F

    df = (spark.read.format("quire").options(**params.source_options(), framing="jsonl")
          .schema(SCHEMA).load())
    return (df.where(F.col("ts").isNotNull())
            .withColumn("hour", F.date_trunc("hour", F.col("ts")))
            .groupBy("key", "hour")
            .agg(F.count(F.lit(1)).alias("messages"),
                 F.sum(F.octet_length("value") + 1).alias("bytes"),
                 F.countDistinct("journal").alias("journals"),
                 F.min("offset").alias("first_offset"),
                 F.max("offset").alias("last_offset"))
            .withColumn("date", F.date_format("hour", "yyyy-MM-dd")))


def run(spark: Any, params: JobParams) -> Any:
    """Compute and write the report; returns the DataFrame read back from the output."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    result = build(spark, params)
    (result.repartition("date").sortWithinPartitions("key", "hour")
     .write.mode("overwrite").partitionBy("date").parquet(params.out))
    # An empty result writes no part file: read back with the schema we wrote.
    return spark.read.schema(result.schema).parquet(params.out)


def main(argv: Sequence[str] | None = None) -> int:
    params, master = parse_argv(argv, f"{NAME}: {DESCRIPTION}")
    spark = session(f"quire-{NAME}", master)
    try:
        written = run(spark, params)
        print(f"{NAME}: wrote {written.count()} rows to {params.out}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
