"""The coordinator server process: connections, RPC dispatch, hosted replicas.

One `Server` per process. It mirrors etcd (KeySpace), announces its membership, runs
the allocator, hosts a Replica per journal assigned to it (following assignment changes
live), and serves one RPC at a time per connection after Hello/HelloAck. As the primary
of a journal it pulses it (a zero-byte append) whenever its route changes, so the
pipeline syncs and the route is advertised consistent.

Every task has an owner: topology tasks live in the server's TaskGroup; connection
handlers are tracked and cancelled (their appends roll back) at shutdown.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import msgspec

from protocol.logs import get_logger
from protocol.native import HOT_PATH
from protocol import (
    AppendRequest,
    AppendResponse,
    ApplyRequest,
    ApplyResponse,
    BrokerInfo,
    FetchFragmentRequest,
    Fragment,
    Hello,
    HelloAck,
    LabelSet,
    ListBrokersRequest,
    ListBrokersResponse,
    ListFragmentsRequest,
    ListRequest,
    ListResponse,
    ProcessId,
    ReadRequest,
    ReplicateProposal,
    Route,
    Status,
    Suspend,
)
from protocol.auth import Capability, TokenError, authorize_apply
from protocol.errors import Forbidden, ProtocolError, QuireError, ValidationError
from protocol.stream import FrameStream, serve_frames

from . import metrics
from .append_api import serve_append
from .auth_gate import REFUSAL_RESPONSE, ConnAuth, Gate, refusal_response
from .drain import drain, record_heads
from .host import Host, ServerConfig
from .hosting import Hosting
from .read_api import serve_fetch, serve_list_fragments, serve_read
from .replica import Persister
from .replicate_api import serve_replicate
from .replicate_mux import serve_mux

__all__ = ["Server", "ServerConfig"]

log = get_logger(__name__)

HELLO_TIMEOUT = 10.0


def _dump_tasks() -> None:
    """`kill -USR2 <pid>`: every asyncio task's stack on stderr (where a shutdown hangs)."""
    for task in asyncio.all_tasks():
        print(f"task {task.get_name()}:", file=sys.stderr)
        coro = task.get_coro()
        while coro is not None:  # the await chain, outermost first
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None:
                print(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}",
                      file=sys.stderr)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)


class Server(Host):
    """The connections side: accept, hello, one RPC at a time, and the lifecycle."""

    def __init__(self, cfg: ServerConfig, persister: Persister | None = None) -> None:
        super().__init__(cfg, persister)
        self.topology = Hosting(self)
        self.stopping = asyncio.Event()
        self.ready = asyncio.Event()
        self.port = 0
        self._conns: set[asyncio.Task[None]] = set()
        self._withdrawn = False
        self.gate = Gate(cfg.keyring)

    # -- lifecycle --------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        # Read at scrape time from the metrics thread (all_tasks copes with that).
        metrics.ASYNCIO_TASKS.set_function(lambda: len(asyncio.all_tasks(loop)))
        for sig, handler in ((signal.SIGTERM, self.stopping.set), (signal.SIGINT, self.stopping.set),
                             (signal.SIGUSR2, _dump_tasks)):
            try:
                loop.add_signal_handler(sig, handler)
            except (NotImplementedError, RuntimeError):
                pass
        host, _, port = self.cfg.listen.rpartition(":")
        async with self.topology.connected():
            self.keyspace = self.topology.keyspace
            server = await serve_frames(self._accept, host or "127.0.0.1", int(port),
                                        backlog=1024, ssl=self.cfg.server_ssl,
                                        ssl_handshake_timeout=HELLO_TIMEOUT
                                        if self.cfg.server_ssl else None)
            self.port = server.sockets[0].getsockname()[1]
            try:
                async with asyncio.TaskGroup() as tg:
                    self._tg = tg
                    self.recover()
                    await self.topology.start(tg)
                    self.ready.set()
                    # The loop's class says whether uvloop is really in charge (main.py
                    # asks for it; tests and embedders may run us on plain asyncio).
                    log.info("coordinator serving", id=str(self.me), listen=self.cfg.listen,
                             loop=type(asyncio.get_running_loop()).__module__,
                             hot_path=HOT_PATH.describe())
                    await self.stopping.wait()
                    log.info("coordinator stopping", id=str(self.me))
                    # Still listening while draining: persist workers fetch the rolled
                    # fragments from us, peers replicate; only new appends are refused.
                    await drain(self, self.topology)  # roll, mark exiting, persist (drain.py)
                    self._withdrawn = True
                    server.close()
                    self.topology.stop()
            finally:
                self._tg = None
                server.close()
                for t in list(self._conns):
                    t.cancel()
                if self._conns:
                    await asyncio.gather(*self._conns, return_exceptions=True)
                for r in list(self.replicas.values()):
                    if r.pipeline is not None:
                        await self.teardown_pipeline(r)
                self.replicate_mux.close()
                if self._withdrawn:
                    record_heads(self)  # a graceful exit only (drain.py)
        self.files.close()
        log.info("coordinator stopped", id=str(self.me))

    # -- connections ------------------------------------------------------------------

    async def _accept(self, conn: FrameStream) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(conn)
        except asyncio.CancelledError:
            pass
        except ProtocolError as exc:
            if type(exc).__name__ != "ConnectionClosed":
                log.info("closing a connection that broke the protocol", peer=conn.peer, error=str(exc))
            await conn.send_error(str(exc))
        except (ConnectionError, OSError) as exc:
            log.info("connection failed", peer=conn.peer, error=repr(exc))
        except Exception:  # noqa: BLE001 - one broken connection must not take the server down
            log.exception("connection handler failed", peer=conn.peer)
            await conn.send_error("internal error", Status.UNAVAILABLE)
        finally:
            self._conns.discard(task)
            conn.abort()

    async def _serve(self, conn: FrameStream) -> None:
        async with asyncio.timeout(HELLO_TIMEOUT):
            frame = await conn.read()
        if not isinstance(frame.message, Hello):
            raise ProtocolError(f"expected Hello, got {type(frame.message).__name__}")
        try:
            auth = self.gate.admit(frame.message.token, conn.peer)
        except TokenError as exc:
            # Before any request is read: a bad token costs one verify and one frame.
            await conn.send_error(f"token refused: {exc}", Status.UNAUTHORIZED)
            return
        if frame.message.mux:
            # A primary's multiplexed replicate connection (replicate_mux.py): each of
            # its channels presents its own journal's token; this one must replicate.
            if auth.on and not auth.claims.caps & Capability.REPLICATE:  # type: ignore[union-attr]
                await conn.send_error("a multiplexed connection needs the REPLICATE "
                                      "capability", Status.FORBIDDEN)
                return
            await conn.send(HelloAck(process_id=self.me, mux=True))
            await serve_mux(self, conn)
            return
        await conn.send(HelloAck(process_id=self.me))
        while not self._withdrawn:
            try:
                frame = await conn.read()
            except ProtocolError as exc:
                if type(exc).__name__ == "ConnectionClosed":
                    return
                raise
            if not await self._dispatch(conn, frame.message, frame.payload, auth):
                return

    def _labels_of(self, journal: str) -> LabelSet | None:
        entry = self.keyspace.journals.get(journal) if self.keyspace is not None else None
        return entry.spec.labels if entry is not None else None

    async def _dispatch(self, conn: FrameStream, msg: object, payload: bytes | memoryview,
                        auth: ConnAuth) -> bool:
        # The one auth check (auth_gate.py): every RPC, before its handler runs. Apply's
        # per-change check needs the specs in etcd and runs in _apply.
        if auth.on and type(msg) in REFUSAL_RESPONSE:
            if (auth.remaining() or 0.0) <= 0:
                # A pooled connection outlived its token: nothing more on it.
                await conn.send_error("token expired", Status.UNAUTHORIZED)
                return False
            refusal = auth.check(msg, self._labels_of)
            if refusal is not None:
                answer, keep = refusal_response(msg, refusal)
                await conn.send(answer)
                return keep
        if isinstance(msg, AppendRequest):
            if self.stopping.is_set():
                # Draining: the spools it leads are being rolled for exit. The client
                # retries (elsewhere, or here after the restart); its content is unread,
                # so the connection closes.
                await conn.send(AppendResponse(status=Status.UNAVAILABLE,
                                               message="coordinator is shutting down"))
                return False
            self.append_started()
            try:
                left = auth.remaining()  # an append still streaming at token expiry aborts
                expires = time.monotonic() + left if left is not None else float("inf")
                return await serve_append(self, conn, msg, self.cfg.min_append_rate, expires)
            finally:
                self.append_finished()
        if isinstance(msg, ReadRequest):
            left = auth.remaining()
            if left is None:
                return await serve_read(self, conn, msg)
            deadline = asyncio.timeout(left)
            try:  # a (blocking) read ends when its token does; the client re-presents one
                async with deadline:
                    return await serve_read(self, conn, msg)
            except TimeoutError:
                if not deadline.expired():
                    raise
                log.info("read cut at token expiry", subject=auth.subject, journal=msg.journal)
                return False
        if isinstance(msg, ReplicateProposal):
            left = auth.remaining()
            if left is None:
                return await serve_replicate(self, conn, msg)
            deadline = asyncio.timeout(left)
            try:  # a replicate stream ends when its token does; the primary re-forms it
                async with deadline:
                    return await serve_replicate(self, conn, msg)
            except TimeoutError:
                if not deadline.expired():
                    raise
                log.info("replicate stream cut at token expiry", subject=auth.subject,
                         journal=msg.proposal.journal)
                return False
        if isinstance(msg, FetchFragmentRequest):
            return await serve_fetch(self, conn, msg)
        if isinstance(msg, ListFragmentsRequest):
            return await serve_list_fragments(self, conn, msg)
        if isinstance(msg, ListRequest):
            return await self._list(conn, msg, auth)
        if isinstance(msg, ApplyRequest):
            return await self._apply(conn, msg, auth)
        if isinstance(msg, ListBrokersRequest):
            return await self._list_brokers(conn)
        raise ProtocolError(f"unexpected {type(msg).__name__} at the start of an RPC")

    async def _list(self, conn: FrameStream, req: ListRequest, auth: ConnAuth) -> bool:
        from topology.assignments import with_endpoints

        from .specs import list_page, list_specs

        entries = await list_specs(self.topology.client, self.cfg.root, req.selector)
        # Out-of-scope journals are not listed (Gazette: List filters by the claims).
        entries = [e for e in entries if auth.visible(e.spec.name, e.spec.labels)
                   and e.spec.name > req.page_token]
        entries, token = list_page(entries, req.page_limit)
        # Each route with its members' endpoints (as Gazette's): a client that lists
        # the journals it writes routes its appends straight to their primaries.
        endpoints = {pid: m.spec.endpoint for pid, m in self.keyspace.members.items()}
        entries = [msgspec.structs.replace(e, route=with_endpoints(e.route, endpoints))
                   for e in entries]
        await conn.send(ListResponse(header=self.topology.resolver._header(Route()),
                                     journals=tuple(entries), next_page_token=token))
        return True

    async def _apply(self, conn: FrameStream, req: ApplyRequest, auth: ConnAuth) -> bool:
        from .specs import apply_specs

        guard = None
        if auth.on:
            def guard(changes):  # noqa: ANN001, ANN202 - (name, current, new) per change
                refusal = authorize_apply(auth.claims, changes)
                if refusal is not None:
                    auth.refused(refusal, "ApplyRequest")
                    raise Forbidden(refusal.message)
        try:
            rev = await apply_specs(self.topology.client, self.cfg.root, req.changes, guard)
        except ValidationError as exc:
            await conn.send(ApplyResponse(status=Status.BAD_REQUEST, message=str(exc)))
            return True
        except QuireError as exc:
            status = getattr(exc, "status", Status.UNAVAILABLE)
            await conn.send(ApplyResponse(status=status, message=str(exc)))
            return True
        await self.keyspace.wait_for_revision(rev, 10.0)  # read our own write
        await conn.send(ApplyResponse(revision=rev))
        return True

    async def _list_brokers(self, conn: FrameStream) -> bool:
        ks = self.keyspace
        infos = []
        for pid, m in sorted(ks.members.items()):
            mine = ks.assignments_of(pid)
            infos.append(BrokerInfo(id=pid, endpoint=m.spec.endpoint,
                                    journal_limit=m.spec.journal_limit, assigned=len(mine),
                                    primaries=sum(1 for a in mine if a.slot == 0),
                                    exiting=m.spec.exiting,
                                    health=getattr(m.spec, "health", "")))
        await conn.send(ListBrokersResponse(brokers=tuple(infos)))
        return True
