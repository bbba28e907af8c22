"""window-counts: a job target of kind `spark` (docs/jobs.md) — one window's messages
counted per journal (and per a JSON field), read by Spark straight from the store and
written through the quire sink under the run's `idempotency_key`.

    python -m spark.jobs.window_counts --run '<run context JSON>' [--master URL]

The run context is what the workers' run executor passes every target: the window's
offset range in each journal (`ranges`), the journals' stores, the brokers, the output
journal and `idempotency_key` (`job/<job>/<window start>[/rerun-n]`). Spark reads each
range (`begin`/`end` options) from the store, counts per (journal[, args.field]),
coalesces the counts to one partition (so every attempt partitions them alike) and writes
them with `idempotency_key`: every attempt of a run — a new Spark application each time —
derives the same producer and history, so a retried run's output lands once. Prints the
result as one JSON line (the run's `result`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

NAME = "window-counts"
DESCRIPTION = "job target: one window's messages per journal (and field), written once"


def counts(spark: Any, ctx: dict[str, Any]) -> Any:
    """The window's counts as a DataFrame (None when the window is empty)."""
    from pyspark.sql import functions as F

    field = str((ctx.get("args") or {}).get("field", ""))
    frames = []
    for journal, (begin, end) in sorted(ctx["ranges"].items()):
        if end <= begin:
            continue
        schema = "journal string, offset bigint" + (f", `{field}` string" if field else "")
        frames.append(spark.read.format("quire").schema(schema)
                      .options(store=ctx["stores"][journal], journal=journal, begin=str(begin),
                               end=str(end), framing="jsonl",
                               fallbackStores=",".join(
                                   (ctx.get("fallback_stores") or {}).get(journal) or ()))
                      .load())
    if not frames:
        return None
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    keys = ["journal", *([field] if field else [])]
    out = df.groupBy(*keys).agg(F.count(F.lit(1)).alias("messages"))
    if field:
        out = out.withColumn(field, F.coalesce(F.col(field), F.lit("")))
    return (out.withColumn("job", F.lit(ctx["job"]))
            .withColumn("window_start", F.lit(int(ctx["window_start"])))
            .withColumn("window_end", F.lit(int(ctx["window_end"])))
            .withColumn("rerun", F.lit(int(ctx.get("rerun", 0))))
            .orderBy(*keys).coalesce(1))


def run(spark: Any, ctx: dict[str, Any]) -> dict[str, Any]:
    """Count the window on `spark` and write the counts to `output` under the run's
    `idempotency_key`; the run's result (tests call this on their session's Spark)."""
    df = counts(spark, ctx)
    rows = df.collect() if df is not None else []
    if rows and ctx.get("output"):
        (df.write.format("quire").option("brokers", ",".join(ctx["brokers"]))
         .option("journal", ctx["output"]).option("framing", "jsonl")
         .option("idempotency_key", ctx["idempotency_key"]).mode("append").save())
    return {"rows": len(rows), "messages": sum(int(r["messages"]) for r in rows),
            "idempotency_key": ctx["idempotency_key"]}


def main(argv: Sequence[str] | None = None) -> int:
    from spark.jobs.common import session

    p = argparse.ArgumentParser(description=f"{NAME}: {DESCRIPTION}")
    p.add_argument("--run", required=True, help="the run context (JSON)")
    p.add_argument("--master", default=None)
    ns = p.parse_args(argv)
    ctx = json.loads(ns.run)
    master = ns.master or (ctx.get("args") or {}).get("master") or "local[2]"
    spark = session(f"quire-{NAME}-{ctx['window_start']}", master,
                    conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                          "spark.driver.bindAddress": "127.0.0.1",
                          "spark.driver.host": "127.0.0.1"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = run(spark, ctx)
    finally:
        spark.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
