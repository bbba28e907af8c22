"""A blocking facade over Client, for scripts, notebooks and Spark drivers.

The async client runs on a private event loop in a daemon thread; every method submits
a coroutine there and waits. Reads come back as a plain iterator that pulls one item at
a time from the loop, so a slow consumer never makes the loop buffer a whole journal.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Iterable, Iterator
from typing import Any, TypeVar

from protocol import ApplyChange, BrokerInfo, FragmentInfo, JournalSpec, LabelSelector, ListEntry

from .body import AppendData
from .client import Client
from .results import AppendResult

T = TypeVar("T")


class SyncClient:
    def __init__(self, endpoints: Iterable[str] | str | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="quire-client",
                                        daemon=True)
        self._thread.start()
        self._client: Client = self._call(self._make(endpoints, kwargs))

    @staticmethod
    async def _make(endpoints: Iterable[str] | str | None, kwargs: dict[str, Any]) -> Client:
        return Client(endpoints, **kwargs)

    def _call(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        if self._loop.is_closed():
            raise RuntimeError("SyncClient is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    @property
    def client(self) -> Client:
        """The async client (use only from coroutines submitted to its loop)."""
        return self._client

    def append(self, journal: str, data: AppendData, **kwargs: Any) -> AppendResult:
        if hasattr(data, "__aiter__"):
            raise TypeError("SyncClient.append takes bytes or a binary file")
        return self._call(self._client.append(journal, data, **kwargs))

    def wait_writable(self, journals: Iterable[str], timeout: float = 30.0) -> None:
        """Wait until each journal takes an (empty) append: just applied journals are
        assigned and routed within a few seconds. Raises the last refusal once `timeout`
        passes for one journal."""
        for journal in journals:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    self.append(journal, b"")
                    break
                except Exception:  # noqa: BLE001 - not assigned or routed yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def read(self, journal: str, offset: int = 0, **kwargs: Any) -> Iterator[tuple[int, bytes]]:
        reader = self._client.read(journal, offset, **kwargs)
        try:
            while True:
                try:
                    yield self._call(reader.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._loop.is_closed():
                self._call(reader.aclose())

    def read_all(self, journal: str, offset: int = 0, **kwargs: Any) -> bytes:
        return b"".join(data for _, data in self.read(journal, offset, **kwargs))

    def list_journals(self, selector: LabelSelector | str = "") -> list[ListEntry]:
        return self._call(self._client.list_journals(selector))

    def get_journal(self, name: str) -> ListEntry:
        return self._call(self._client.get_journal(name))

    def apply(self, changes: Iterable[ApplyChange | JournalSpec], **kwargs: Any) -> int:
        return self._call(self._client.apply(list(changes), **kwargs))

    def apply_chunked(self, changes: Iterable[ApplyChange | JournalSpec], **kwargs: Any) -> Any:
        """Client.apply_chunked: an ApplyResult (applied, unchanged, revision)."""
        return self._call(self._client.apply_chunked(list(changes), **kwargs))

    def delete(self, name: str, **kwargs: Any) -> int:
        return self._call(self._client.delete(name, **kwargs))

    def list_fragments(self, journal: str, **kwargs: Any) -> list[FragmentInfo]:
        return self._call(self._client.list_fragments(journal, **kwargs))

    def list_brokers(self) -> list[BrokerInfo]:
        return self._call(self._client.list_brokers())

    def write_head(self, journal: str) -> int:
        return self._call(self._client.write_head(journal))

    def reset_head(self, journal: str) -> AppendResult:
        return self._call(self._client.reset_head(journal))

    def suspend(self, journal: str, *, force: bool = False) -> AppendResult:
        return self._call(self._client.suspend(journal, force=force))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._client.close(), timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
