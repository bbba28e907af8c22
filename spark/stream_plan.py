"""The driver side of a stream over journals, shared by Spark's streaming source
(spark.stream) and the Dask streaming query (spark.dask_stream): which journals are
read, where each one ends now, and the parts of a micro-batch.

A micro-batch is the bytes between two offset maps (spark.offsets). `initial_offsets`
is where a new query starts (startingOffsets); `end_offsets(start, max_bytes)` asks the
coordinators for each journal's write head (re-resolving the selector, so journals
created since the last trigger join at offset 0), capped by maxBytesPerTrigger;
`plan_parts(start, end)` lists each journal's fragment index and plans its persisted
part as store spans (spark.planner.Span) and the rest as one coordinator tail
(spark.offsets.Tail). Without brokers the stream follows the persisted index only.

No pyspark or dask import here. The client and store are opened lazily and are never
pickled (`__getstate__` drops them).
"""

from __future__ import annotations

from typing import Any

from .offsets import Tail, cap_offsets, check_offsets, plan_journal
from .options import OptionError
from .planner import Span
from .stream_options import StreamOptions


class StreamPlanning:
    """Planning of a stream's micro-batches from `self.options` (StreamOptions)."""

    options: StreamOptions
    _client: Any = None
    _store: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = state["_store"] = None
        return state

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

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

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

    def initial_offsets(self) -> dict[str, int]:
        starting = self.options.starting
        journals = self.journals()
        if starting == "latest":
            return self.heads(journals)
        offsets = {j: 0 for j in journals}
        if isinstance(starting, dict):
            offsets.update(starting)
        return offsets

    def end_offsets(self, start: dict[str, int], max_bytes: int | None) -> dict[str, int]:
        """The next micro-batch's end: every journal's head, capped at about `max_bytes`."""
        start = check_offsets(start, "offsets")
        journals = sorted(set(self.journals()) | set(start))
        heads = self.heads(journals)
        # A journal's end never moves back (a deleted journal keeps its offset).
        heads = {j: max(heads.get(j, 0), start.get(j, 0)) for j in journals}
        if not max_bytes:
            return heads
        pending = [j for j in journals if heads[j] > start.get(j, 0)]
        indexes = {j: self._index(j) for j in pending}
        return cap_offsets(start, heads, indexes, max_bytes)

    def plan_parts(self, start: dict[str, int], end: dict[str, int]) -> list[Span | Tail]:
        """Store spans and coordinator tails covering [start, end) of every journal."""
        start, end = check_offsets(start, "offsets"), check_offsets(end, "offsets")
        parts: list[Span | Tail] = []
        kwargs = self.options.read.plan_kwargs()
        kwargs.pop("begin"), kwargs.pop("end")
        for journal in sorted(end):
            lo, hi = start.get(journal, 0), end[journal]
            if hi <= lo:
                continue
            spans, tail = plan_journal(journal, self._index(journal), lo, hi,
                                       tail=bool(self.options.brokers), **kwargs)
            parts.extend(spans)
            if tail is not None:
                parts.append(tail)
        return parts
