"""A Spark driver the exactly-once sink tests run as a subprocess, so they can give it
its own master (`local[2,4]` retries tasks; a standalone cluster speculates), fault
environment (QUIRE_SINK_FAULT), and kill it.

    python -m tests.spark.eo_driver batch --master local[2,4] --brokers B \\
        --write J1:true --write J2:false --rows 400 --partitions 4 [--speculation]
    python -m tests.spark.eo_driver stream --brokers B --store S --src J --dst J \\
        --checkpoint DIR [--until-idle]

`batch` writes rows {"n": 0..rows-1} (n-th partition: a contiguous range) once per
`--write journal:exactly_once`; `stream` copies the source journal's messages into the
destination through `writeStream.format("quire")`, hash-partitioned by offset so a
re-run micro-batch has the same rows per partition. Each prints `done` at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def session(master: str, speculation: bool) -> Any:
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("quire-eo-sink-test")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.pyspark.driver.python", sys.executable)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.executor.memory", "512m"))
    if speculation:
        # Speculate as soon as half the tasks are done and one runs for over a second.
        builder = (builder.config("spark.speculation", "true")
                   .config("spark.speculation.quantile", "0.5")
                   .config("spark.speculation.multiplier", "1.0")
                   .config("spark.speculation.minTaskRuntime", "1s")
                   .config("spark.speculation.interval", "200ms")
                   .config("spark.speculation.efficiency.enabled", "false")
                   # Wait for both executors (two hosts) before the first job.
                   .config("spark.cores.max", "2")
                   .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
                   .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "300s"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from spark.datasource import register

    register(spark)
    return spark


def batch(ns: argparse.Namespace) -> None:
    spark = session(ns.master, ns.speculation)
    try:
        df = spark.range(0, ns.rows, 1, ns.partitions).selectExpr(
            "id as n", "repeat('x', 40) as pad")
        for target in ns.write:
            journal, _, eo = target.rpartition(":")
            (df.write.format("quire").option("brokers", ns.brokers).option("journal", journal)
             .option("exactly_once", eo).mode("append").save())
            print(f"wrote {journal} exactly_once={eo}", flush=True)
    finally:
        spark.stop()


def stream(ns: argparse.Namespace) -> None:
    spark = session(ns.master, False)
    try:
        query = (spark.readStream.format("quire").option("store", ns.store)
                 .option("brokers", ns.brokers).option("journals", ns.src).load()
                 .repartition(2, "offset").selectExpr("value")
                 .writeStream.format("quire").option("brokers", ns.brokers)
                 .option("journal", ns.dst).option("checkpointLocation", ns.checkpoint)
                 .trigger(processingTime="1 second").start())
        print(f"query {query.id}", flush=True)
        if ns.until_idle:
            query.processAllAvailable()
            query.stop()
        else:
            while query.isActive:
                time.sleep(0.5)
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("batch")
    b.add_argument("--write", action="append", required=True)
    b.add_argument("--rows", type=int, default=400)
    b.add_argument("--partitions", type=int, default=4)
    b.add_argument("--speculation", action="store_true")
    s = sub.add_parser("stream")
    s.add_argument("--store", required=True)
    s.add_argument("--src", required=True)
    s.add_argument("--dst", required=True)
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--until-idle", action="store_true")
    for q in (b, s):
        q.add_argument("--master", default="local[2,4]")
        q.add_argument("--brokers", required=True)
    ns = p.parse_args(argv)
    (batch if ns.mode == "batch" else stream)(ns)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
