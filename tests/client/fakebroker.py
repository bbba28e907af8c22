"""An in-process stand-in for a coordinator, speaking the real wire protocol.

It is *our own* server's protocol, not a mock of a third-party service: client unit
tests use it to drive exact situations (a redirect, a broker that answers early, a
persisted fragment handed out by URL) deterministically and without etcd. Behaviour
against real coordinators is covered by tests/cli/test_cluster.py.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from protocol import (
    AppendAbort,
    AppendChunk,
    AppendCommit,
    AppendRequest,
    AppendResponse,
    ApplyRequest,
    ApplyResponse,
    BrokerInfo,
    Fragment,
    FragmentInfo,
    Header,
    Hello,
    HelloAck,
    JournalSpec,
    ListBrokersRequest,
    ListBrokersResponse,
    ListEntry,
    ListFragmentsRequest,
    ListFragmentsResponse,
    ListRequest,
    ListResponse,
    ProcessId,
    ReadContent,
    ReadRequest,
    ReadResponse,
    Route,
    Status,
)
from protocol.errors import ProtocolError
from protocol.stream import FrameStream, serve_frames


class FakeBroker:
    def __init__(self, name: str = "fake") -> None:
        self.id = ProcessId("local", f"{name}-0000")
        self.endpoint = ""
        self.specs: dict[str, tuple[JournalSpec, int]] = {}
        self.content: dict[str, bytearray] = {}
        self.revision = 1
        self.redirect_to: str | None = None
        """If set, appends answer NOT_JOURNAL_PRIMARY_BROKER naming this endpoint primary."""
        self.fail_next_appends = 0
        """Answer this many appends with UNAVAILABLE (after reading them)."""
        self.drop_after_commit = 0
        """Drop the connection of this many appends after reading their commit, without
        answering (a broker killed after replicating the commit, or a lost answer)."""
        self.silent_next = 0
        """Read this many appends whole and never answer them (a hung broker)."""
        self.commit_unknown_next = 0
        """Answer this many appends with COMMIT_UNKNOWN (replication broke after the commit)."""
        self.lost_outcomes_land = True
        """Whether an append answered by a drop or COMMIT_UNKNOWN is committed anyway."""
        self.persisted: dict[str, list[tuple[Fragment, str]]] = {}
        """Fragments handed out by URL on reads (fragment, url)."""
        self.appends: list[tuple[str, bytes]] = []
        self.requests: list[object] = []
        self.hellos = 0
        """Connections opened (each says Hello once)."""
        self._changed = asyncio.Condition()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle --------------------------------------------------------------------

    async def start(self, port: int = 0) -> FakeBroker:
        self._server = await serve_frames(self._serve, "127.0.0.1", port)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.endpoint = f"{host}:{port}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()

    def route(self) -> Route:
        return Route(members=(self.id,), primary=0, endpoints=(self.endpoint,))

    def header(self) -> Header:
        return Header(process_id=self.id, route=self.route())

    def create(self, name: str, **labels: str) -> None:
        from protocol import LabelSet

        self.revision += 1
        self.specs[name] = (JournalSpec(name=name, replication=1, labels=LabelSet.of(labels)),
                            self.revision)
        self.content.setdefault(name, bytearray())

    # -- serving ----------------------------------------------------------------------

    async def _serve(self, stream: FrameStream) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            hello = await stream.read()
            assert isinstance(hello.message, Hello)
            self.hellos += 1
            await stream.send(HelloAck(process_id=self.id))
            while True:
                frame = await stream.read()
                message = frame.message
                self.requests.append(message)
                if isinstance(message, AppendRequest):
                    await self._append(stream, message)
                elif isinstance(message, ReadRequest):
                    if not await self._read(stream, message):
                        return
                elif isinstance(message, ListRequest):
                    entries = tuple(ListEntry(spec=s, mod_revision=r, route=self.route())
                                    for s, r in self.specs.values()
                                    if message.selector.matches_journal(s.name, s.labels))
                    await stream.send(ListResponse(header=self.header(), journals=entries))
                elif isinstance(message, ApplyRequest):
                    await stream.send(self._apply(message))
                elif isinstance(message, ListFragmentsRequest):
                    frags = tuple(FragmentInfo(spec=f, signed_url=u)
                                  for f, u in self.persisted.get(message.journal, []))
                    await stream.send(ListFragmentsResponse(header=self.header(), fragments=frags))
                elif isinstance(message, ListBrokersRequest):
                    await stream.send(ListBrokersResponse(brokers=(BrokerInfo(
                        id=self.id, endpoint=self.endpoint, journal_limit=1024,
                        assigned=len(self.specs), primaries=len(self.specs)),)))
                else:
                    await stream.send_error(f"unexpected {type(message).__name__}")
                    return
        except (ProtocolError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            stream.transport.close()

    def _apply(self, request: ApplyRequest) -> ApplyResponse:
        for change in request.changes:
            name = change.upsert.name if change.upsert else change.delete
            current = self.specs.get(name)
            expect = change.expect_mod_revision
            if expect != -1 and (current[1] if current else 0) != expect:
                return ApplyResponse(status=Status.ETCD_TRANSACTION_FAILED,
                                     message=f"{name}: expected revision {expect}")
        self.revision += 1
        for change in request.changes:
            if change.upsert:
                self.specs[change.upsert.name] = (change.upsert, self.revision)
                self.content.setdefault(change.upsert.name, bytearray())
            else:
                self.specs.pop(change.delete, None)
        return ApplyResponse(header=self.header(), revision=self.revision)

    async def _append(self, stream: FrameStream, request: AppendRequest) -> None:
        early: AppendResponse | None = None
        if request.journal not in self.specs:
            early = AppendResponse(status=Status.JOURNAL_NOT_FOUND, message="no such journal")
        elif self.redirect_to is not None:
            route = Route(members=(ProcessId("local", "other-0000"),), primary=0,
                          endpoints=(self.redirect_to,))
            early = AppendResponse(status=Status.NOT_JOURNAL_PRIMARY_BROKER,
                                   header=Header(process_id=self.id, route=route))
        if early is not None:
            # Answer at once, then swallow the rest of the RPC so the connection stays
            # usable (what a well-behaved coordinator does).
            await stream.send(early)
        body = bytearray()
        while True:
            frame = await stream.read()
            if isinstance(frame.message, AppendChunk):
                body += frame.payload
            elif isinstance(frame.message, AppendCommit):
                break
            elif isinstance(frame.message, AppendAbort):
                if early is None:
                    await stream.send(AppendResponse(status=Status.ABORTED))
                return
        if early is not None:
            return
        if self.fail_next_appends:
            self.fail_next_appends -= 1
            await stream.send(AppendResponse(status=Status.UNAVAILABLE, message="try again"))
            return
        content = self.content[request.journal]
        if request.offset and request.offset != len(content):
            await stream.send(AppendResponse(status=Status.WRONG_APPEND_OFFSET,
                                             message=f"write head is {len(content)}"))
            return
        if self.silent_next:
            self.silent_next -= 1
            await asyncio.Event().wait()  # until the client gives up and closes
        if self.drop_after_commit or self.commit_unknown_next:
            if self.lost_outcomes_land:
                content += body
                self.appends.append((request.journal, bytes(body)))
            if self.drop_after_commit:
                self.drop_after_commit -= 1
                stream.transport.abort()
                raise ConnectionResetError("dropped after the commit")
            self.commit_unknown_next -= 1
            await stream.send(AppendResponse(status=Status.COMMIT_UNKNOWN, header=self.header(),
                                             message="the commit was sent, then peer reset"))
            return
        begin = len(content)
        content += body
        self.appends.append((request.journal, bytes(body)))
        commit = Fragment(journal=request.journal, begin=begin, end=len(content),
                          sum=hashlib.sha1(body).hexdigest() if body else "0" * 40)
        async with self._changed:
            self._changed.notify_all()
        await stream.send(AppendResponse(header=self.header(), commit=commit))

    async def _read(self, stream: FrameStream, request: ReadRequest) -> bool:
        if request.journal not in self.specs:
            await stream.send(ReadResponse(status=Status.JOURNAL_NOT_FOUND))
            return True
        content = self.content[request.journal]
        offset = len(content) if request.offset == -1 else request.offset
        first = True
        while True:
            for fragment, url in self.persisted.get(request.journal, []):
                if fragment.begin <= offset < fragment.end:
                    await stream.send(ReadResponse(header=self.header() if first else None,
                                                   offset=offset, write_head=len(content),
                                                   fragment=fragment, fragment_url=url))
                    return False  # the client reads the store and reconnects
            end = len(content) if not request.end_offset else min(len(content), request.end_offset)
            if offset < end:
                await stream.send(ReadResponse(
                    header=self.header() if first else None, offset=offset,
                    write_head=len(content),
                    fragment=Fragment(journal=request.journal, begin=0, end=len(content))))
                first = False
                if request.metadata_only:
                    return True
                for i in range(offset, end, 7):  # small chunks: exercise reassembly
                    await stream.send(ReadContent(offset=i), bytes(content[i:min(i + 7, end)]))
                offset = end
                if request.end_offset and offset >= request.end_offset:
                    return True
                continue
            if not request.block or request.metadata_only:
                # (with the route, as a coordinator answers a first response)
                await stream.send(ReadResponse(status=Status.OFFSET_NOT_YET_AVAILABLE,
                                               header=self.header() if first else None,
                                               offset=offset, write_head=len(content)))
                return True
            async with self._changed:
                await self._changed.wait()


@asynccontextmanager
async def running(*brokers: FakeBroker, port: int = 0) -> AsyncIterator[FakeBroker]:
    broker = brokers[0] if brokers else FakeBroker()
    await broker.start(port)
    try:
        yield broker
    finally:
        await broker.stop()
