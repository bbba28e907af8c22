"""`spark.readStream.format("quire")`: journals as a Structured Streaming source.

    df = (spark.readStream.format("quire")
          .option("store", "s3://bucket/quire/").option("brokers", "broker-1:8080")
          .option("selector", "prefix=topics/clicks/")
          .option("startingOffsets", "earliest").option("maxBytesPerTrigger", 64 << 20)
          .load())

Offsets are `{journal: byte offset}` maps, checkpointed by Spark. `latestOffset` asks
the coordinators for each journal's write head (re-resolving the selector, so journals
created since the last trigger join at offset 0); `partitions(start, end)` lists each
journal's fragment index and plans the persisted part as store spans — read straight
from the store, as a batch read — and the rest as one `Tail` partition that executors
read from the coordinators (spark.offsets, spark.tail). Without `brokers` the stream
follows the persisted index only.

The reader is pickled to executors: it carries options and the Arrow schema; its
driver-side client is dropped from the pickle.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from .offsets import Tail, cap_offsets, check_offsets, plan_journal
from .options import OptionError
from .stream_options import StreamOptions


class StreamPartition(InputPartition):
    """A store span (spark.planner.Span) or a coordinator tail (spark.offsets.Tail)."""

    def __init__(self, part: Any) -> None:
        super().__init__(part)
        self.part = part

    def __repr__(self) -> str:
        p = self.part
        kind = "tail" if isinstance(p, Tail) else "span"
        return f"StreamPartition({kind} {p.journal}@[{p.begin}, {p.end}))"


class QuireStreamReader(DataSourceStreamReader):
    def __init__(self, options: StreamOptions, schema: Any) -> None:
        from .arrow import spark_arrow_schema

        self.options = options
        # Same schema checks as a batch read (JSON columns need jsonl framing).
        self.arrow_schema = spark_arrow_schema(schema, options.read.framing)
        self._client: Any = None
        self._store: Any = None
        # Fail at query start on journals that do not exist (with brokers to ask).
        if options.brokers and options.read.journals:
            self._check_journals(options.read.journals)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = state["_store"] = None
        return state

    # -- driver side --------------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            from quire.client import SyncClient

            self._client = SyncClient(list(self.options.brokers))
        return self._client

    @property
    def store(self) -> Any:
        if self._store is None:
            from .catalog import open_read_store

            self._store = open_read_store(self.options.read)
        return self._store

    def _check_journals(self, journals: tuple[str, ...]) -> None:
        from quire.client import QuireError

        try:
            known = {e.spec.name for e in self.client.list_journals("")}
        except QuireError as exc:
            raise OptionError("brokers", f"cannot list journals: {exc}") from None
        missing = sorted(set(journals) - known)
        if missing:
            raise OptionError("journals", f"unknown journal {missing[0]!r} "
                                          f"(no such spec on {', '.join(self.options.brokers)})")

    def journals(self) -> list[str]:
        """The journals read now (a selector is resolved again at every trigger)."""
        opts = self.options.read
        found = set(opts.journals)
        if opts.selector:
            if self.options.brokers:
                found.update(e.spec.name for e in self.client.list_journals(opts.selector))
            else:
                from .catalog import resolve_journals

                found.update(resolve_journals(opts, self.store))
        return sorted(found)

    def _index(self, journal: str) -> list[Any]:
        from .catalog import load_index

        return load_index(self.store, journal, self.options.read.index)

    def heads(self, journals: list[str]) -> dict[str, int]:
        """Each journal's end: its write head, or (store-only) its contiguous persisted end."""
        if self.options.brokers:
            from protocol.errors import JournalNotFound

            out = {}
            for j in journals:
                try:
                    out[j] = self.client.write_head(j)
                except JournalNotFound:
                    pass  # deleted since it was read: it stays at its offset
            return out
        from .planner import covering_runs

        out = {}
        for j in journals:
            runs, _ = covering_runs(self._index(j))
            out[j] = runs[0][-1][1] if runs else 0
        return out

    def initialOffset(self) -> dict:
        starting = self.options.starting
        journals = self.journals()
        if starting == "latest":
            return self.heads(journals)
        offsets = {j: 0 for j in journals}
        if isinstance(starting, dict):
            offsets.update(starting)
        return offsets

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

        if self.options.max_bytes:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        start = check_offsets(start, "offsets")
        journals = sorted(set(self.journals()) | set(start))
        heads = self.heads(journals)
        # A journal's end never moves back (a deleted journal keeps its offset).
        heads = {j: max(heads.get(j, 0), start.get(j, 0)) for j in journals}
        max_bytes = getattr(limit, "max_bytes", None)
        if not max_bytes:
            return heads
        pending = [j for j in journals if heads[j] > start.get(j, 0)]
        indexes = {j: self._index(j) for j in pending}
        return cap_offsets(start, heads, indexes, max_bytes)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start, end = check_offsets(start, "offsets"), check_offsets(end, "offsets")
        parts: list[InputPartition] = []
        kwargs = self.options.read.plan_kwargs()
        kwargs.pop("begin"), kwargs.pop("end")
        for journal in sorted(end):
            lo, hi = start.get(journal, 0), end[journal]
            if hi <= lo:
                continue
            spans, tail = plan_journal(journal, self._index(journal), lo, hi,
                                       tail=bool(self.options.brokers), **kwargs)
            parts.extend(StreamPartition(s) for s in spans)
            if tail is not None:
                parts.append(StreamPartition(tail))
        return parts

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the journals keep their content

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- executor side ------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        opts = self.options.read
        part = partition.part  # type: ignore[attr-defined]
        if isinstance(part, Tail):
            from .tail import tail_batches

            yield from tail_batches(part, self.options.brokers, self.arrow_schema,
                                    opts.framing, opts.batch_bytes)
            return
        from .arrow import read_record_batches
        from .framing import StoreRef

        ref = StoreRef(opts.store, opts.store_options, opts.verify)
        yield from read_record_batches(part, ref, self.arrow_schema, opts.framing,
                                       opts.batch_bytes)
