"""window-counts: a job target (docs/jobs.md) — one window's messages counted per journal
(and per a JSON field), read by Spark straight from the store, appended once.

    python -m spark.jobs.window_counts --run '<run context JSON>' [--master URL]

The run context is what the workers' run executor passes every target: the window's
offset range in each journal (`ranges`), the journals' stores, the output journal and
the run's output identity (`producer`, `generation`, `history`). Spark reads each range
(`begin`/`end` options) from the store, counts per (journal[, args.field]) and the driver
appends the counts to the output journal as one identified append: every attempt of a
run uses the same identity, so a retried run (a new Spark application) lands once.
Prints the result as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

NAME = "window-counts"
DESCRIPTION = "job target: one window's messages per journal (and field), appended once"


def count(spark: Any, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    field = str((ctx.get("args") or {}).get("field", ""))
    frames = []
    for journal, (begin, end) in sorted(ctx["ranges"].items()):
        if end <= begin:
            continue
        schema = "journal string, offset bigint" + (f", `{field}` string" if field else "")
        frames.append(spark.read.format("quire").schema(schema)
                      .options(store=ctx["stores"][journal], journal=journal, begin=str(begin),
                               end=str(end), framing="jsonl").load())
    if not frames:
        return []
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    keys = ["journal", *([field] if field else [])]
    rows = df.groupBy(*keys).agg(F.count(F.lit(1)).alias("messages")).collect()
    out = []
    for row in sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys)):
        item = {"job": ctx["job"], "window_start": ctx["window_start"],
                "window_end": ctx["window_end"], "journal": row["journal"],
                "messages": int(row["messages"])}
        if field:
            item[field] = row[field] if row[field] is not None else ""
        out.append(item)
    return out


async def append_once(ctx: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, int]:
    from protocol import FragmentSpec, JournalSpec
    from protocol.errors import StatusError
    from quire.client import Client, TxnId

    async with Client(ctx["brokers"], retry_timeout=60) as client:
        try:
            await client.get_journal(ctx["output"])
        except StatusError:
            store = next(iter((ctx.get("stores") or {}).values()), "")
            await client.apply([JournalSpec(name=ctx["output"], replication=1,
                                            fragment=FragmentSpec(stores=(store,) if store else ()))])
        body = b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in rows)
        txn = TxnId(ctx["producer"], ctx["generation"], ctx["history"], 1)
        r = await client.append(ctx["output"], body, txn=txn)
        return {"begin": r.begin, "end": r.end}


def main(argv: Sequence[str] | None = None) -> int:
    from spark.jobs.common import session

    p = argparse.ArgumentParser(description=f"{NAME}: {DESCRIPTION}")
    p.add_argument("--run", required=True, help="the run context (JSON)")
    p.add_argument("--master", default=None)
    ns = p.parse_args(argv)
    ctx = json.loads(ns.run)
    spark = session(f"quire-{NAME}-{ctx['job']}-{ctx['window_start']}", ns.master or "local[2]",
                    conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                          "spark.driver.bindAddress": "127.0.0.1",
                          "spark.driver.host": "127.0.0.1"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rows = count(spark, ctx)
    finally:
        spark.stop()
    written = asyncio.run(append_once(ctx, rows)) if rows and ctx.get("output") else {}
    print(json.dumps({"rows": len(rows), "messages": sum(r["messages"] for r in rows),
                      **written}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
