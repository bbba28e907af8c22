"""The Spark sink: exactly-once (identified) appends vs plain appends, rows/s, same run.

    python -m bench.sink [--json OUT] [--rows 200000] [--partitions 8] [--repeat 3]
                         [--master local[2]]

Starts a one-coordinator cluster (etcd + a coordinator, chaos.cluster.LocalCluster)
and a SparkSession, then writes the same DataFrame (`--rows` rows of ~80-byte JSON
lines in `--partitions` tasks) with `df.write.format("quire")` into a journal, in
alternating rounds: `exactly_once=true` (the default: each task's append carries its
producer, history and txn) and `exactly_once=false` (plain appends). Each round is one
whole write, timed from `.save()` to its return. Prints both rows/s (best round) and
`ratio_exactly_once_vs_plain`, the median of the per-round-pair ratios. The goal is
>= 0.9; the machine's load average is printed with it, since it is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import write_json


def write_rows(df: Any, brokers: str, journal: str, exactly_once: bool) -> float:
    t = time.perf_counter()
    (df.write.format("quire").option("brokers", brokers).option("journal", journal)
     .option("exactly_once", "true" if exactly_once else "false").mode("append").save())
    return time.perf_counter() - t


def compare(spark: Any, brokers: str, journals: tuple[str, str], *, rows: int,
            partitions: int, repeat: int) -> dict[str, Any]:
    """Alternate exactly-once and plain writes of the same rows; rows/s of each."""
    df = spark.range(0, rows, 1, partitions).selectExpr(
        "id as n", "concat('key-', id % 1000) as key", "repeat('x', 40) as pad")
    df = df.cache()
    df.count()
    write_rows(df, brokers, journals[1], False)  # warm up the Python workers
    rounds = []
    for i in range(repeat):
        order = (True, False) if i % 2 == 0 else (False, True)
        times = {eo: write_rows(df, brokers, journals[0] if eo else journals[1], eo)
                 for eo in order}
        rounds.append({"exactly_once_s": times[True], "plain_s": times[False]})
    df.unpersist()
    return {
        "rows": rows,
        "partitions": partitions,
        "exactly_once_rows_s": rows / min(r["exactly_once_s"] for r in rounds),
        "plain_rows_s": rows / min(r["plain_s"] for r in rounds),
        "ratio_exactly_once_vs_plain": statistics.median(
            r["plain_s"] / r["exactly_once_s"] for r in rounds),
        "rounds": rounds,
    }


def make_journals(brokers: list[str], names: tuple[str, ...]) -> None:
    from protocol import FragmentSpec, JournalSpec
    from quire.client import SyncClient

    with SyncClient(brokers) as client:
        client.apply([JournalSpec(name=j, replication=1,
                                  fragment=FragmentSpec(length=64 << 20)) for j in names])
        client.wait_writable(names, timeout=60)


def main(argv: list[str] | None = None) -> int:
    from bench.batch import spark_session
    from chaos.cluster import LocalCluster
    from spark.datasource import register

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write results as JSON to this file")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    journals = ("bench/sink/exactly-once", "bench/sink/plain")
    with tempfile.TemporaryDirectory(prefix="quire-bench-sink-") as tmp, \
            LocalCluster(n=1, workdir=Path(tmp) / "cluster") as cluster:
        make_journals(cluster.endpoints, journals)
        spark = spark_session(args.master)
        try:
            register(spark)
            result = compare(spark, ",".join(cluster.endpoints), journals, rows=args.rows,
                             partitions=args.partitions, repeat=args.repeat)
        finally:
            spark.stop()
    load = os.getloadavg()[0]
    result["params"] = {**vars(args), "cpus": os.cpu_count(), "load": load}
    print(f"rows {result['rows']} in {result['partitions']} tasks: exactly-once "
          f"{result['exactly_once_rows_s']:,.0f} rows/s, plain {result['plain_rows_s']:,.0f} "
          f"rows/s, ratio_exactly_once_vs_plain {result['ratio_exactly_once_vs_plain']:.2f} "
          f"(goal >= 0.9; load {load:.2f})", file=sys.stdout)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
