"""minute-counts: a continuous job — per-minute event counts from source journals into an
output journal, micro-batch by micro-batch.

Input: JSON-lines journals (a selector or names) whose messages carry `key` and an
ISO-8601 `ts`. Each micro-batch counts its events per (minute, key) and appends one JSON
line per count to the output journal through the quire sink, exactly once per batch
(spark.foreach.write_batch: a batch re-run after a restart lands once):
`{"minute": "2026-01-01T00:03:00Z", "key": "user-07", "events": 4, "batch": 2}`.
Counts are per micro-batch (stateless): a minute that spans micro-batches has several
lines, and their sum is the minute's count. The output journal is created if missing.

    python -m spark.jobs.minute_counts --selector topic=events --out-journal demo/minute-counts
        [--brokers HOST:PORT] [--store URL] [--checkpoint DIR] [--max-bytes-per-trigger N]
        [--until-idle] [--restarts N] [--master spark://HOST:7077 --conf spark.driver.host=ADDRESS]
        [-O s3.endpoint=http://HOST:9000 -O s3.accessKey=... ...]

`-O` options go to the `quire` source as they are (spark/README.md): executors on other
hosts read the store with them, not with the driver's environment. `--conf` is Spark
configuration, as spark-submit's (a driver outside a standalone cluster names the
address executors reach it at with spark.driver.host). `--brokers` defaults to $QUIRE_BROKER, else a running `quire up`'s, `--store` to the first
source journal's fragment store. Without `--until-idle` it runs until interrupted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NAME = "minute-counts"
DESCRIPTION = "continuous: per-minute event counts per key, from journals into a journal"
SCHEMA = "journal string, offset bigint, key string, ts timestamp"


@dataclass
class StreamParams:
    brokers: str
    out_journal: str
    checkpoint: str
    store: str = ""
    selector: str = ""
    journal: str = ""
    max_bytes_per_trigger: int = 0
    trigger_seconds: float = 1.0
    options: dict[str, str] = field(default_factory=dict)
    """Extra source options (s3.endpoint, s3.accessKey, ...): they travel to executors."""


def _client(brokers: str) -> Any:
    from quire.client import SyncClient

    return SyncClient(brokers)


def prepare(params: StreamParams) -> StreamParams:
    """Fill in the store from the source journals' specs; create the output journal."""
    from protocol import FragmentSpec, JournalSpec, ValidationError

    with _client(params.brokers) as client:
        names = [j for j in params.journal.split(",") if j]
        entries = client.list_journals(params.selector) if params.selector else \
            [client.get_journal(j) for j in names]
        if not entries:
            raise ValidationError("selector", f"{params.selector!r} matches no journal")
        store = params.store or next((e.spec.fragment.stores[0] for e in entries
                                      if e.spec.fragment.stores), "")
        if not store:
            raise ValidationError("store", "the source journals name no store; give --store")
        existing = {e.spec.name for e in client.list_journals("")}
        if params.out_journal not in existing:
            client.apply([JournalSpec(name=params.out_journal, replication=1,
                                      fragment=FragmentSpec(stores=(store,)))])
    params.store = store
    return params


def start(spark: Any, params: StreamParams) -> Any:
    """Start the query; returns the StreamingQuery."""
    from pyspark.sql import functions as F

    from spark.foreach import write_batch

    reader = (spark.readStream.format("quire").option("store", params.store)
              .option("brokers", params.brokers))
    if params.selector:
        reader = reader.option("selector", params.selector)
    if params.journal:
        reader = reader.option("journals", params.journal)
    if params.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", str(params.max_bytes_per_trigger))
    if params.options:
        reader = reader.options(**params.options)
    events = reader.schema(SCHEMA).load()

    def per_batch(batch: Any, batch_id: int) -> None:
        counts = (batch.where(F.col("ts").isNotNull())
                  .groupBy(F.date_format(F.date_trunc("minute", "ts"),
                                         "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("minute"), "key")
                  .agg(F.count(F.lit(1)).alias("events"))
                  .withColumn("batch", F.lit(batch_id)))
        # Exactly once: keyed by the query id and batch id, so a batch re-run after a
        # restart lands once; one partition, whose rows (a batch's counts) do not depend
        # on how the source split the batch.
        write_batch(counts.coalesce(1), batch_id, brokers=params.brokers,
                    journal=params.out_journal)

    return (events.writeStream.foreachBatch(per_batch)
            .option("checkpointLocation", params.checkpoint)
            .trigger(processingTime=f"{params.trigger_seconds} seconds").start())


def _run(spark: Any, params: StreamParams, until_idle: bool, restarts: int) -> Any:
    """Run the query (until idle, or until interrupted); a query that fails is started
    again from its checkpoint, in this driver (its executors stay), up to `restarts`
    times. The sink is exactly once per micro-batch, so a restart cannot change the
    counts. Returns the last query."""
    from pyspark.errors import StreamingQueryException

    for attempt in range(restarts + 1):
        query = start(spark, params)
        try:
            if until_idle:
                query.processAllAvailable()
            else:
                query.awaitTermination()
            return query
        except StreamingQueryException as exc:
            if attempt == restarts:
                raise
            reason = str(exc).splitlines()[0][:300]
            print(f"{NAME}: query failed ({reason}); restarting from {params.checkpoint} "
                  f"({attempt + 1} of {restarts})", file=sys.stderr, flush=True)
        finally:
            query.stop()
    raise AssertionError("unreachable")


def _pairs(p: argparse.ArgumentParser, flag: str, items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def stream_parser(description: str) -> argparse.ArgumentParser:
    """The flags of a minute-counts job's source, output and checkpoint, shared by the
    Spark job and the Dask one (spark.jobs.dask_minute_counts)."""
    from protocol.discovery import effective_env

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--brokers", default=effective_env().get("QUIRE_BROKER", ""))
    p.add_argument("--selector", default="")
    p.add_argument("--journal", default="", help="source journal(s), comma-separated")
    p.add_argument("--out-journal", required=True)
    p.add_argument("--store", default="")
    p.add_argument("--checkpoint", default="")
    p.add_argument("--max-bytes-per-trigger", type=int, default=0)
    p.add_argument("--option", "-O", action="append", default=[], metavar="KEY=VALUE",
                   help="source option, e.g. s3.endpoint=URL (repeatable)")
    p.add_argument("--until-idle", action="store_true",
                   help="stop once everything appended so far is counted")
    return p


def stream_params(p: argparse.ArgumentParser, ns: argparse.Namespace,
                  checkpoint_prefix: str) -> StreamParams:
    """The parsed flags of `stream_parser` as checked StreamParams (a temporary
    checkpoint directory if none was given)."""
    if not ns.brokers or not (ns.selector or ns.journal):
        p.error("give --brokers (or $QUIRE_BROKER) and --selector or --journal")
    return prepare(StreamParams(
        brokers=ns.brokers, out_journal=ns.out_journal, store=ns.store, selector=ns.selector,
        journal=ns.journal, max_bytes_per_trigger=ns.max_bytes_per_trigger,
        options=_pairs(p, "--option", ns.option),
        checkpoint=ns.checkpoint or tempfile.mkdtemp(prefix=checkpoint_prefix)))


def main(argv: Sequence[str] | None = None) -> int:
    from spark.jobs.common import session

    p = stream_parser(f"{NAME}: {DESCRIPTION}")
    p.add_argument("--master", default=None)
    p.add_argument("--conf", "-c", action="append", default=[], metavar="KEY=VALUE",
                   help="Spark configuration, e.g. spark.driver.host=ADDRESS (repeatable)")
    p.add_argument("--restarts", type=int, default=0, metavar="N",
                   help="start a failed query again from its checkpoint, up to N times")
    ns = p.parse_args(argv)
    params = stream_params(p, ns, "quire-minute-counts-")
    conf = _pairs(p, "--conf", ns.conf)
    spark = session(f"quire-{NAME}", ns.master, conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        query = _run(spark, params, ns.until_idle, ns.restarts)
        for progress in query.recentProgress:
            if progress["numInputRows"]:
                print(f"{NAME}: micro-batch {progress['batchId']}: "
                      f"{progress['numInputRows']} events -> {params.out_journal}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
