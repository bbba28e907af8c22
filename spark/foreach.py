"""`foreachBatch` into quire, exactly once: each micro-batch's batch write is keyed by the
streaming query's id and the batch id (spark.sink, spark.exactly_once).

    from spark.foreach import foreach_batch, write_batch
    stream.writeStream.foreachBatch(foreach_batch(brokers="broker-1:8080", journal="out/a"))
    # or, inside your own function:
    def per_batch(df, batch_id):
        write_batch(df.groupBy("key").count(), batch_id, brokers=..., journal="out/a")
"""

from __future__ import annotations

from typing import Any

from .exactly_once import SinkIdentityError
from .sink import QUERY_ID


def write_batch(df: Any, batch_id: int, **options: Any) -> None:
    """Write one `foreachBatch` micro-batch to quire, exactly once across re-runs.

        def per_batch(df, batch_id):
            write_batch(df.where(...), batch_id, brokers="broker-1:8080", journal="out/a")
        stream.writeStream.foreachBatch(per_batch).option("checkpointLocation", ...)

    The write's idempotency key is `query/<query id>/batch/<batch id>` (the query id is
    the one the checkpoint keeps across restarts), or `<idempotency_key>/batch/<batch
    id>` when an `idempotency_key` option is given. Two writes of one batch to the same
    journal need different keys. Each re-run of the batch must compute the same rows
    per partition (coalesce, or a deterministic partitioning)."""
    from .datasource import register

    opts = {str(k): v for k, v in options.items()}
    lowered = {k.lower(): v for k, v in opts.items()}
    eo = str(lowered.get("exactly_once", lowered.get("exactlyonce", "true"))).strip().lower()
    if eo not in ("false", "0", "no", "off"):
        base = next((str(v) for k, v in opts.items()
                     if k.lower() in ("idempotency_key", "idempotencykey")), "")
        if not base:
            query = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID)
            if not query:
                raise SinkIdentityError("write_batch outside a streaming query (no query "
                                        "id): give an idempotency_key")
            base = f"query/{query}"
        opts = {k: v for k, v in opts.items()
                if k.lower() not in ("idempotency_key", "idempotencykey")}
        opts["idempotency_key"] = f"{base}/batch/{int(batch_id)}"
    register(df.sparkSession)
    df.write.format("quire").options(**{k: str(v) for k, v in opts.items()}) \
        .mode("append").save()


def foreach_batch(**options: Any) -> Any:
    """`writeStream.foreachBatch(foreach_batch(brokers=..., journal=...))`: every
    micro-batch written by `write_batch`."""
    def per_batch(df: Any, batch_id: int) -> None:
        write_batch(df, batch_id, **options)
    return per_batch
