"""A streaming query on Dask: journals in, micro-batch by micro-batch, into a journal,
exactly once — the Dask counterpart of `readStream.format("quire")` + `foreachBatch`.

    import distributed
    from spark.dask_stream import DaskStreamQuery
    client = distributed.Client("tcp://scheduler:8786")
    query = DaskStreamQuery(client, count_per_key, checkpoint="/ck/counts",
                            out_journal="out/counts", brokers="broker-1:8080",
                            store="s3://bucket/quire/", selector="topic=events",
                            schema={"key": "string", "ts": "timestamp[us, tz=UTC]"},
                            maxBytesPerTrigger=1 << 20, **{"s3.endpoint": "http://..."})
    query.process_all_available()          # or query.run() until query.stop()

`transform(events, batch_id)` gets a micro-batch's messages as a Dask DataFrame (the
`schema` columns, one partition per planned part) and returns the Dask DataFrame to
append to `out_journal` (each row one JSON line, or its `value` column: spark.appender).

Each trigger (on the driver):
1. ends = each journal's write head (spark.stream_plan, as Spark's `latestOffset`,
   capped by `maxBytesPerTrigger`); nothing pending: no batch.
2. `offsets/<n>` in the checkpoint: the batch's [start, end) (spark.dask_checkpoint),
   before anything runs.
3. parts = the persisted runs as store spans and the rest as coordinator tails
   (spark.offsets); each part is one read task on the cluster's workers, which read
   the store and the coordinators themselves.
4. the transform's output is appended by the Dask writer (spark.dask_writer) with the
   idempotency key `query/<query id>/batch/<n>`; then `commits/<n>`.

A driver restarted on the checkpoint re-runs a batch that has offsets but no commit over
the same offsets: the same rows, appended under the same key, land once. As with Spark,
exactly-once needs the transform to compute the same rows per output partition from the
same input however it was split into parts (aggregate, then one partition).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .dask_checkpoint import Checkpoint, PlannedBatch
from .offsets import Tail
from .options import OptionError, ReadOptions
from .planner import Span
from .stream_options import StreamOptions, parse_stream_options
from .stream_plan import StreamPlanning

Transform = Callable[[Any, int], Any]


@dataclass(frozen=True)
class BatchResult:
    batch_id: int
    start: dict[str, int]
    end: dict[str, int]
    parts: int
    """Read tasks: store spans, and `tails` of them coordinator tails."""
    tails: int
    appended: list[tuple[str, int, int, int]]
    rerun: bool
    """True when this batch was planned by an earlier driver and is run again."""

    @property
    def bytes(self) -> int:
        return sum(e - self.start.get(j, 0) for j, e in self.end.items())

    @property
    def rows_written(self) -> int:
        return sum(a[3] for a in self.appended)


def read_part(part: Span | Tail, opts: ReadOptions, brokers: tuple[str, ...],
              schema: Any) -> Any:
    """One read task (on a worker): a store span or a coordinator tail as pandas."""
    from .dask_reader import _types_mapper, read_span_frame

    if not isinstance(part, Tail):
        return read_span_frame(part, opts, schema)
    import pyarrow as pa

    from .tail import tail_batches

    batches = list(tail_batches(part, brokers, schema, opts.framing, opts.batch_bytes))
    return pa.Table.from_batches(batches, schema=schema).to_pandas(types_mapper=_types_mapper)


class _Source(StreamPlanning):
    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._client = self._store = None


class DaskStreamQuery:
    def __init__(self, client: Any, transform: Transform, *, checkpoint: str,
                 out_journal: str, brokers: str, schema: Any = None,
                 trigger_seconds: float = 1.0, **source_options: Any) -> None:
        """`client`: a `distributed.Client` (or any `dask.compute` scheduler);
        `source_options`: the streaming source's options (store, selector or journals,
        startingOffsets, maxBytesPerTrigger, s3.endpoint, ...; spark/README.md)."""
        from .dask_reader import _arrow_schema

        opts = {k: v for k, v in source_options.items() if v is not None}
        self.options = parse_stream_options({**opts, "brokers": brokers})
        if not self.options.brokers:
            raise OptionError("brokers", "required: the coordinators to read tails from "
                                         "and to append to (host:port)")
        if not out_journal:
            raise OptionError("out_journal", "required: the journal the batches append to")
        self.schema = _arrow_schema(self.options.read, schema)
        self.source = _Source(self.options)
        if self.options.read.journals:
            self.source._check_journals(self.options.read.journals)
        self.client, self.transform = client, transform
        self.out_journal, self.brokers = out_journal, brokers
        self.trigger_seconds = trigger_seconds
        self.checkpoint = Checkpoint(checkpoint)
        self.progress: list[BatchResult] = []
        self._initial: dict[str, int] | None = None
        self._stopped = threading.Event()

    @property
    def id(self) -> str:
        return self.checkpoint.query_id

    def idempotency_key(self, batch_id: int) -> str:
        return f"query/{self.id}/batch/{batch_id}"

    def _next(self) -> tuple[PlannedBatch, bool] | None:
        """The next batch to run: the last planned one if it has no commit (a re-run),
        else a new one up to the current ends; None when nothing is pending."""
        last = self.checkpoint.last_planned()
        if last is not None and not self.checkpoint.committed(last.batch_id):
            return last, True
        if last is not None:
            start = last.end
        else:
            if self._initial is None:
                self._initial = self.source.initial_offsets()
            start = self._initial
        end = self.source.end_offsets(start, self.options.max_bytes)
        if all(e <= start.get(j, 0) for j, e in end.items()):
            return None
        batch = PlannedBatch(0 if last is None else last.batch_id + 1, start, end)
        self.checkpoint.plan(batch)
        return batch, False

    def events(self, start: dict[str, int], end: dict[str, int]) -> tuple[Any, list[Any]]:
        """The messages of [start, end) as a Dask DataFrame (one partition per part),
        and the parts (spark.planner.Span or spark.offsets.Tail)."""
        import dask.dataframe as dd

        from .dask_reader import _types_mapper

        parts = self.source.plan_parts(start, end)
        meta = self.schema.empty_table().to_pandas(types_mapper=_types_mapper)
        if not parts:
            return dd.from_pandas(meta, npartitions=1), parts
        return dd.from_map(read_part, parts, opts=self.options.read,
                           brokers=self.options.brokers, schema=self.schema, meta=meta,
                           label="quire-stream-read", enforce_metadata=False), parts

    def run_batch(self) -> BatchResult | None:
        """One trigger: run the next micro-batch (or re-run an uncommitted one)."""
        from .dask_writer import to_quire
        from .exactly_once import fault_stream_commit

        nxt = self._next()
        if nxt is None:
            return None
        batch, rerun = nxt
        events, parts = self.events(batch.start, batch.end)
        out = self.transform(events, batch.batch_id)
        appended = to_quire(out, self.brokers, journal=self.out_journal,
                            idempotency_key=self.idempotency_key(batch.batch_id),
                            scheduler=self.client)
        fault_stream_commit(batch.batch_id)  # test hook: inert unless QUIRE_SINK_FAULT
        self.checkpoint.commit(batch.batch_id, appended)
        tails = sum(isinstance(p, Tail) for p in parts)
        result = BatchResult(batch.batch_id, batch.start, batch.end, len(parts), tails,
                             appended, rerun)
        self.progress.append(result)
        return result

    def process_all_available(self) -> list[BatchResult]:
        """Run micro-batches until one trigger finds nothing pending."""
        done = []
        while not self._stopped.is_set():
            result = self.run_batch()
            if result is None:
                break
            done.append(result)
        return done

    def run(self, on_batch: Callable[[BatchResult], None] | None = None) -> None:
        """Trigger every `trigger_seconds` until `stop()`."""
        while not self._stopped.is_set():
            began = time.monotonic()
            result = self.run_batch()
            if result is not None and on_batch is not None:
                on_batch(result)
            if result is None:
                self._stopped.wait(max(0.0, self.trigger_seconds - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stopped.set()
        self.source.close_client()
