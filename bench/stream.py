"""Streaming source vs batch source: rows/s over the same journals, same run.

    python -m bench.stream [--json OUT] [--mib 64] [--journals 4] [--fragment-mib 4]
                           [--max-bytes-per-trigger MIB] [--repeat 3] [--master local[2]]

The store is filled with bench.batch's JSON lines in gzip fragments that end on message
boundaries, as fragments written by quire do (spools roll between appends, and writers
append whole messages): micro-batch ends fall on fragment ends (spark.offsets). The batch figure is `spark.read.format("quire")...count()`. The streaming figure
is a `readStream` over the same journals from `earliest` into Spark's `noop` sink, timed
from `start()` until `processAllAvailable()` returns, with `maxBytesPerTrigger` cutting the
content into several micro-batches (each one: a trigger's offset query, a listing of the
index, a planned batch). The stream runs store-only (no `brokers`): everything is
persisted, so both read the same fragments through the same framing, and the ratio is
the cost of micro-batching. Rounds alternate batch and stream; the ratio is their median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.common import write_json


def populate(store: Any, journals: int, mib: float, fragment_mib: float,
             seed: int = 1) -> list[Any]:
    """Journals `bench/topic/part-NNN` of about `mib` MiB in all, gzip fragments of about
    `fragment_mib` MiB cut just after a newline."""
    import hashlib
    import random

    from bench.batch import make_content
    from fragment_store import persist_fragment
    from protocol import Codec, Fragment

    rng = random.Random(seed)
    frag_len = max(1, int(fragment_mib * (1 << 20)))
    out = []
    for j in range(journals):
        content = make_content(rng, int(mib * (1 << 20)) // journals)
        pos = 0
        while pos < len(content):
            cut = content.find(b"\n", pos + int(frag_len * rng.uniform(0.6, 1.4)))
            end = len(content) if cut < 0 else cut + 1
            chunk = content[pos:end]
            frag = Fragment(journal=f"bench/topic/part-{j:03d}", begin=pos, end=end,
                            sum=hashlib.sha1(chunk).hexdigest(), codec=Codec.GZIP)
            out.append(persist_fragment(store, frag, [chunk]))
            pos = end
    return out


def batch_rows(spark: Any, url: str) -> tuple[int, float]:
    t = time.perf_counter()
    n = (spark.read.format("quire").option("store", url).option("selector", "prefix=bench/")
         .load().count())
    return n, time.perf_counter() - t


def stream_rows(spark: Any, url: str, checkpoint: str, max_bytes: int) -> tuple[int, int, float]:
    """(rows, micro-batches, seconds) of one streaming pass over everything."""
    t = time.perf_counter()
    reader = (spark.readStream.format("quire").option("store", url)
              .option("selector", "prefix=bench/").option("startingOffsets", "earliest"))
    if max_bytes:
        reader = reader.option("maxBytesPerTrigger", str(max_bytes))
    query = (reader.load().writeStream.format("noop")
             .option("checkpointLocation", checkpoint).start())
    try:
        query.processAllAvailable()
        elapsed = time.perf_counter() - t
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    return sum(p["numInputRows"] for p in progress), len(progress), elapsed


def compare(spark: Any, url: str, workdir: str, *, max_bytes: int, repeat: int = 3
            ) -> dict[str, Any]:
    """Alternate batch and stream reads of the store at `url`; rows/s of each."""
    batch_rows(spark, url)  # warm up the Python workers
    rounds = []
    for i in range(repeat):
        n_batch, t_batch = batch_rows(spark, url)
        n_stream, batches, t_stream = stream_rows(spark, url, f"{workdir}/ck-{i}", max_bytes)
        assert n_stream == n_batch, (n_stream, n_batch)  # same rows, once each
        rounds.append({"rows": n_batch, "batch_s": t_batch, "stream_s": t_stream,
                       "micro_batches": batches})
    rows = rounds[0]["rows"]
    return {
        "rows": rows,
        "micro_batches": rounds[0]["micro_batches"],
        "batch_rows_s": rows / min(r["batch_s"] for r in rounds),
        "stream_rows_s": rows / min(r["stream_s"] for r in rounds),
        "stream_ratio": statistics.median(r["batch_s"] / r["stream_s"] for r in rounds),
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.batch import spark_session
    from fragment_store import open_store

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write results as JSON to this file")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--journals", type=int, default=4)
    p.add_argument("--fragment-mib", type=float, default=4.0)
    p.add_argument("--max-bytes-per-trigger", type=float, default=16.0,
                   help="MiB per micro-batch (0: all available at once)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quire-bench-stream-") as tmp:
        url = f"file://{tmp}/store/"
        fragments = populate(open_store(url), args.journals, args.mib, args.fragment_mib)
        spark = spark_session(args.master)
        try:
            result = compare(spark, url, tmp, repeat=args.repeat,
                             max_bytes=int(args.max_bytes_per_trigger * (1 << 20)))
        finally:
            spark.stop()
    result["params"] = {**vars(args), "fragments": len(fragments), "cpus": os.cpu_count(),
                        "load": os.getloadavg()[0]}
    print(f"rows {result['rows']}, {result['micro_batches']} micro-batches: "
          f"batch {result['batch_rows_s']:,.0f} rows/s, stream {result['stream_rows_s']:,.0f} "
          f"rows/s, stream/batch {result['stream_ratio']:.2f} (load {os.getloadavg()[0]:.2f})",
          file=sys.stdout)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
