"""Batch read throughput: Spark (`quire` data source) and Dask against a raw sequential
read of the same fragment objects.

    python -m bench.batch [--json OUT] [--mib 256] [--journals 4] [--fragment-mib 32]
                          [--codec gzip|zstd|snappy|none|mix] [--master local[2]] [--s3]
                          [--cuts arbitrary|messages] [--repeat 3] [--skip-spark] [--raw-only]

The baseline fetches every fragment object and decompresses it (fragment_store's
`read_fragments(verify=False)`, no SHA-1 check), one after another, in this process; the
verified raw read proves each fragment before handing it on, the next one proven on a
worker thread meanwhile (read-ahead depth QUIRE_VERIFY_READ_AHEAD, default 1; 0 = none).

Verification (docs/integrity.md) is on by default everywhere: every round also runs
raw, serial, Dask and Spark *unverified* (`unverifiedReadsRiskCorruption=true`), and
`verify_ratio_<reader>` is the median over rounds of unverified time / verified time —
the throughput kept with the SHA-1 proof (goal >= 0.95). Spark and Dask do
the same fetches and decompression plus message framing and row building (Arrow), in
parallel (Spark local[2], Dask threads). Each figure is MB/s of raw journal content;
the ratios are what we track (target >= 0.5). `serial` is quire's own read path (plan,
fetch, decompress, frame, build Arrow rows) run span after span in this process, without
an engine: its ratio is the per-core cost of framing. The SparkSession is started and
warmed up before timing; a Spark figure includes the per-query planning (a Python worker
lists the store) and the JVM's conversion of Arrow batches to rows.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.common import write_json
from protocol import Codec, Fragment

CODECS = ("none", "gzip", "zstd", "snappy")


def make_content(rng: random.Random, nbytes: int) -> bytes:
    """JSON lines of about `nbytes`: keys, hours, uneven padding."""
    pads = [b"x" * n for n in range(0, 120, 7)]
    lines = []
    size = 0
    i = 0
    while size < nbytes:
        line = b'{"key":"k%d","n":%d,"ts":"2026-01-01T%02d:%02d:00Z","pad":"%s"}\n' % (
            rng.randrange(50), i, rng.randrange(24), rng.randrange(60), rng.choice(pads))
        lines.append(line)
        size += len(line)
        i += 1
    return b"".join(lines)


def populate(store: Any, journals: int, mib: int, fragment_mib: float, codec: str,
             seed: int = 1, cuts: str = "arbitrary") -> list[Fragment]:
    """Write journals into the store; cut fragments at arbitrary byte positions, or
    (`cuts="messages"`) after a delimiter, as coordinators cut them (at appends): then
    no span reads past its end into the next fragment."""
    from fragment_store import persist_fragment

    rng = random.Random(seed)
    per = mib * (1 << 20) // journals
    frag_len = int(fragment_mib * (1 << 20))
    out = []
    for j in range(journals):
        content = make_content(rng, per)
        pos, k = 0, 0
        while pos < len(content):
            end = min(len(content), pos + int(frag_len * rng.uniform(0.6, 1.4)))
            if cuts == "messages" and end < len(content):
                end = content.index(b"\n", end - 1) + 1
            chunk = content[pos:end]
            c = CODECS[k % 4] if codec == "mix" else codec
            frag = Fragment(journal=f"bench/topic/part-{j:03d}", begin=pos, end=end,
                            sum=hashlib.sha1(chunk).hexdigest(), codec=Codec(c))
            out.append(persist_fragment(store, frag, [chunk]))
            pos, k = end, k + 1
    return out


def raw_read(store: Any, fragments: list[Fragment], verify: bool = False,
             cpu: list[float] | None = None) -> tuple[int, float]:
    """Every fragment fetched and decompressed (`verify`: and proven, the next fragment
    proven while this one is used: `read_fragments`' read-ahead, QUIRE_VERIFY_READ_AHEAD)
    in turn; returns (bytes, wall seconds) and appends the process's CPU seconds to `cpu`,
    if given."""
    from fragment_store import read_fragments

    c = time.process_time()
    t = time.perf_counter()
    total = 0
    for chunk in read_fragments(store, fragments, verify=verify):
        total += len(chunk)
    elapsed = time.perf_counter() - t
    if cpu is not None:
        cpu.append(time.process_time() - c)
    return total, elapsed


def serial_read(url: str, options: dict[str, str]) -> tuple[int, float]:
    """Plan + frame + Arrow rows, one span after another in this process: the per-core
    cost of quire's read path without any engine."""
    from spark.arrow import base_arrow_schema, read_record_batches
    from spark.catalog import plan_read
    from spark.framing import StoreRef
    from spark.options import parse_options

    t = time.perf_counter()
    opts = parse_options({"store": url, "selector": "prefix=bench/", **options})
    schema = base_arrow_schema(opts.framing)
    ref = StoreRef(opts.store, opts.store_options, opts.verify)
    total = 0
    for span in plan_read(opts):
        for rb in read_record_batches(span, ref, schema, opts.framing):
            total += rb.column(2).nbytes
    return total, time.perf_counter() - t


def dask_read(url: str, options: dict[str, str]) -> tuple[int, int, float]:
    import dask

    from spark.dask_reader import read_journals

    t = time.perf_counter()
    ddf = read_journals(url, selector="prefix=bench/", **options)
    counts = ddf.map_partitions(lambda df: df.value.str.len().sum() + len(df)).compute(
        scheduler="threads")
    elapsed = time.perf_counter() - t
    return int(counts.sum()), ddf.npartitions, elapsed


def spark_session(master: str) -> Any:
    from pyspark.sql import SparkSession

    from spark.datasource import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName("quire-bench-batch")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def spark_read(spark: Any, url: str, options: dict[str, str]) -> tuple[int, int, float]:
    from pyspark.sql import functions as F

    t = time.perf_counter()
    df = (spark.read.format("quire").option("store", url).option("selector", "prefix=bench/")
          .options(**options).load())
    row = df.agg(F.sum(F.octet_length("value") + 1).alias("b"), F.count(F.lit(1)).alias("n")).first()
    elapsed = time.perf_counter() - t
    return int(row.b), df.rdd.getNumPartitions(), elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write results as JSON to this file")
    p.add_argument("--mib", type=int, default=256, help="raw journal content in MiB")
    p.add_argument("--journals", type=int, default=4)
    p.add_argument("--fragment-mib", type=float, default=32.0)
    p.add_argument("--codec", default="gzip", choices=[*CODECS, "mix"],
                   help="fragment codec (gzip is FragmentSpec's default)")
    p.add_argument("--cuts", default="arbitrary", choices=["arbitrary", "messages"],
                   help="fragment ends: arbitrary bytes (messages span fragments: spans read "
                        "past), or after a delimiter (as coordinators write them)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds (raw, dask, spark each); ratios are the median over rounds")
    p.add_argument("--s3", action="store_true", help="use a moto S3 server instead of a file store")
    p.add_argument("--skip-spark", action="store_true")
    p.add_argument("--raw-only", action="store_true",
                   help="only the raw read (verified and not); also reports its CPU per MiB")
    args = p.parse_args(argv)
    # Rounds re-read the same fragments: a proven-content cache would serve verified reads
    # from memory across rounds. Off here (and in Spark's Python workers, which inherit it).
    os.environ["QUIRE_VERIFY_CACHE_BYTES"] = "0"

    from fragment_store import open_store

    with tempfile.TemporaryDirectory(prefix="quire-bench-batch-") as tmp:
        s3svc = None
        options: dict[str, str] = {}
        if args.s3:
            from tools.services import S3Service

            s3svc = S3Service("bench-s3").__enter__()
            s3svc.create_bucket("bench-batch")
            url = "s3://bench-batch/quire/"
            options = {"s3.endpoint": s3svc.url, "s3.accessKey": s3svc.access_key,
                       "s3.secretKey": s3svc.secret_key}
            store = open_store(url, endpoint=s3svc.url, access_key=s3svc.access_key,
                               secret_key=s3svc.secret_key)
        else:
            url = f"file://{tmp}/store/"
            store = open_store(url)
        try:
            t = time.perf_counter()
            fragments = populate(store, args.journals, args.mib, args.fragment_mib, args.codec,
                                 cuts=args.cuts)
            print(f"populated {len(fragments)} fragments in {time.perf_counter() - t:.1f}s",
                  file=sys.stderr)
            raw_bytes = sum(f.content_length for f in fragments)
            spark = None if args.skip_spark or args.raw_only else spark_session(args.master)
            rounds = []
            try:
                if spark is not None:
                    spark_read(spark, url, options)  # warm up the JVM and Python workers
                if not args.raw_only:
                    dask_read(url, options)
                cpu: dict[str, list[float]] = {"raw": [], "raw_verified": []}
                # Interleave the three reads and compare within a round: on a shared
                # machine the load moves between rounds more than within one.
                unverified = {**options, "unverifiedReadsRiskCorruption": "true"}
                for i in range(args.repeat):
                    # Verified and unverified alternate which goes first, round by round.
                    modes = [("", False, unverified), ("_verified", True, options)]
                    modes = modes if i % 2 == 0 else modes[::-1]
                    r: dict[str, float] = {}
                    for suffix, verify, opts in modes:
                        r["raw" + suffix] = raw_read(store, fragments, verify=verify,
                                                     cpu=cpu["raw" + suffix])[1]
                    if args.raw_only:
                        rounds.append(r)
                        continue
                    for suffix, verify, opts in modes:
                        r["serial" + suffix] = serial_read(url, opts)[1]
                    for suffix, verify, opts in modes:
                        n, dask_parts, r["dask" + suffix] = dask_read(url, opts)
                        assert n == raw_bytes, (n, raw_bytes)
                    if spark is not None:
                        for suffix, verify, opts in modes:
                            n, spark_parts, r["spark" + suffix] = spark_read(spark, url, opts)
                            assert n == raw_bytes, (n, raw_bytes)
                    rounds.append(r)
            finally:
                if spark is not None:
                    spark.stop()
            result: dict[str, Any] = {
                "params": {**vars(args), "raw_bytes": raw_bytes, "fragments": len(fragments),
                           "store": "s3 (moto)" if args.s3 else "file",
                           "cpus": os.cpu_count(), "load": os.getloadavg()[0]},
                "rounds_mb_s": [{k: raw_bytes / v / 1e6 for k, v in r.items()} for r in rounds],
                "dask_partitions": None if args.raw_only else dask_parts,
                "raw_cpu_ms_per_mib": statistics.median(cpu["raw"]) / (raw_bytes / 2**20) * 1e3,
                "raw_verified_cpu_ms_per_mib": statistics.median(cpu["raw_verified"])
                / (raw_bytes / 2**20) * 1e3,
            }
            for name in ("raw", "serial", "dask", "spark"):
                if name in rounds[0]:
                    result[f"{name}_mb_s"] = raw_bytes / min(r[name] for r in rounds) / 1e6
                    result[f"{name}_verified_mb_s"] = raw_bytes / min(
                        r[f"{name}_verified"] for r in rounds) / 1e6
                    result[f"verify_ratio_{name}"] = statistics.median(
                        r[name] / r[f"{name}_verified"] for r in rounds)
            for name in ("serial", "dask", "spark"):
                if name in rounds[0]:
                    # Engines as shipped (verifying) against the unverified raw baseline.
                    result[f"{name}_ratio"] = statistics.median(
                        r["raw"] / r[f"{name}_verified"] for r in rounds)
        finally:
            if s3svc is not None:
                s3svc.__exit__(None, None, None)

    for key in ("raw_mb_s", "raw_verified_mb_s", "verify_ratio_raw", "raw_cpu_ms_per_mib",
                "raw_verified_cpu_ms_per_mib", "serial_mb_s",
                "serial_verified_mb_s", "serial_ratio", "verify_ratio_serial", "dask_mb_s",
                "dask_verified_mb_s", "dask_ratio", "verify_ratio_dask", "spark_mb_s",
                "spark_verified_mb_s", "spark_ratio", "verify_ratio_spark"):
        if key in result:
            print(f"{key:>12}: {result[key]:.2f}")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
