"""The Append RPC at the coordinator: client content source, FSM driver, proxying.

Wire shape: AppendRequest, AppendChunk*, (AppendCommit | AppendAbort) -> AppendResponse.
The broker may answer early (an error before the client finished streaming); it then
closes the connection, because the rest of the client's stream is unread.
"""

from __future__ import annotations

import asyncio
import time

from protocol.logs import get_logger
from protocol import (
    AppendAbort,
    AppendChunk,
    AppendCommit,
    AppendRequest,
    AppendResponse,
    Fragment,
    Status,
)
from protocol.auth import Capability
from protocol.errors import ProtocolError
from protocol.stream import FrameStream
from protocol.wire import encode_frame

from . import metrics
from .append_fsm import NOT_BUFFERED, AppendAborted, AppendFSM, Broker, State
from .append_lane import finish, ok_header, try_lane
from .append_stream import AnswerSink, ProxiedSource
from .append_rules import decide_broken
from .proxy_rules import Reproxy, ReproxyDecision, decide_reproxy, reproxy_budget
from .read_relay import connect_member
from .flow_control import MinRatePolicer

log = get_logger(__name__)

PROXY_TIMEOUT = 30.0
_CONNECT_PACE = 1.0
"""At most one connect a second to a primary that refused or did not answer."""

_COUNTERS: dict[str, object] = {}

_in_flight = 0
# Read at scrape time: a plain int on the hot path instead of a locked inc()/dec().
metrics.APPENDS_IN_FLIGHT.set_function(lambda: _in_flight)


def _appends_counter(status: str):  # noqa: ANN202
    """metrics.APPENDS.labels(status), looked up once per status (labels() takes a lock)."""
    c = _COUNTERS.get(status)
    if c is None:
        c = _COUNTERS[status] = metrics.APPENDS.labels(status)
    return c


class ClientSource:
    """Chunks from the client, policed for a minimum flow rate."""

    def __init__(self, conn: FrameStream, min_rate: float, expires: float = float("inf")) -> None:
        self.conn = conn
        self.min_rate = min_rate
        self.expires = expires
        """Monotonic time the connection's token expires (with leeway): a long append
        still streaming then is aborted and rolled back, like a read is cut."""
        self.policer: MinRatePolicer | None = None
        self.done = False
        """The client's terminator (commit or abort) was read: the connection is in step."""

    async def read_frame(self):  # noqa: ANN201
        try:
            frame = self.conn.read_buffered()  # already here: no timer needed
        except ProtocolError as exc:
            raise AppendAborted(f"client disconnected: {exc}") from None
        now = time.monotonic()
        if now >= self.expires:
            raise AppendAborted("token expired")
        if frame is not None:
            if self.policer is None:
                self.policer = MinRatePolicer(self.min_rate, now)
            if self.policer.deadline(now) <= now:
                raise AppendAborted("too slow: below the minimum append rate")
            return frame
        if self.policer is None:
            # Policing starts when the append is ready for content, not at the request:
            # time spent queued behind other appends is not the client's fault.
            self.policer = MinRatePolicer(self.min_rate, now)
        timeout = self.policer.deadline(now) - now
        if timeout <= 0:
            raise AppendAborted("too slow: below the minimum append rate")
        try:
            # asyncio.timeout, not wait_for: no extra task per chunk on the hot path.
            async with asyncio.timeout(min(timeout, self.expires - now)):
                return await self.conn.read()
        except TimeoutError:
            if time.monotonic() >= self.expires:
                raise AppendAborted("token expired") from None
            raise AppendAborted("too slow: below the minimum append rate") from None
        except ProtocolError as exc:
            raise AppendAborted(f"client disconnected: {exc}") from None

    def next_buffered(self):  # noqa: ANN201 - bytes | memoryview | None | NOT_BUFFERED
        """next_chunk() for a frame already in the buffer; NOT_BUFFERED (nothing taken)
        if the next frame has not fully arrived. Same checks, no coroutine."""
        while True:
            try:
                frame = self.conn.read_buffered()
            except ProtocolError as exc:
                raise AppendAborted(f"client disconnected: {exc}") from None
            if frame is None:
                return NOT_BUFFERED
            now = time.monotonic()
            if now >= self.expires:
                raise AppendAborted("token expired")
            policer = self.policer
            if policer is None:
                policer = self.policer = MinRatePolicer(self.min_rate, now)
            elif policer.deadline(now) <= now:
                raise AppendAborted("too slow: below the minimum append rate")
            msg = frame.message
            if isinstance(msg, AppendChunk):
                if frame.payload:
                    policer.on_bytes(len(frame.payload), now)
                    return frame.payload
                continue
            return self._terminal(msg)

    def _terminal(self, msg: object) -> None:
        """A frame other than a chunk: the commit (None), else AppendAborted."""
        if isinstance(msg, AppendCommit):
            self.done = True
            return None
        if isinstance(msg, AppendAbort):
            self.done = True
            raise AppendAborted(f"client aborted: {msg.reason}")
        raise AppendAborted(f"protocol: unexpected {type(msg).__name__} in an append")

    def throttled(self, seconds: float) -> None:
        if self.policer is not None:
            self.policer.pause(seconds)

    async def next_chunk(self) -> bytes | memoryview | None:
        while True:
            frame = await self.read_frame()
            msg = frame.message
            if isinstance(msg, AppendChunk):
                if not frame.payload:
                    continue
                assert self.policer is not None
                self.policer.on_bytes(len(frame.payload), time.monotonic())
                return frame.payload
            self._terminal(msg)
            return None


async def serve_append(broker: Broker, conn: FrameStream, req: AppendRequest,
                       min_rate: float, expires: float = float("inf")) -> bool:
    """Serve one append; True if the connection may carry another RPC."""
    global _in_flight
    started = time.monotonic()
    _in_flight += 1
    try:
        lane = try_lane(broker, conn, req)
        if lane is not None:  # taken whole, the commit read: the connection is in step
            resp = await finish(lane)
            _answer(conn, req.journal, resp, started, resp.commit, "whole-append lane", True)
            if not conn.writable():  # (otherwise drain() returns at once: skip the call)
                await conn.drain()
            return True
        source = ClientSource(conn, min_rate, expires)
        fsm = AppendFSM(broker, req, source)
        state = await fsm.run_to()  # (= run(): one coroutine frame less to resume through)
        if state is State.PROXY:
            kept = await proxy_append(conn, req, fsm.res, source, _peer_auth(broker, req.journal),
                                      broker)
            if kept is not None:
                return kept
            # Its primary unreachable, the journal moved to us meanwhile (nothing of the
            # append was read or forwarded): run it here.
            fsm = AppendFSM(broker, req, source)
            state = await fsm.run_to()
            if state is State.PROXY:  # moved on again: one plain attempt, then an answer
                return bool(await proxy_append(conn, req, fsm.res, source,
                                               _peer_auth(broker, req.journal)))
        res = fsm.res
        ok = state is State.FINISHED
        header = res.header if res is not None else None
        resp = AppendResponse(
            status=Status.OK if ok else fsm.status,
            header=ok_header(header, req.route_revision) if ok and header is not None else header,
            commit=fsm.commit if ok else None,
            registers=fsm.registers,
            total_chunks=fsm.total_chunks, delayed_chunks=fsm.delayed_chunks,
            message="" if ok else fsm.message)
        _answer(conn, req.journal, resp, started, fsm.commit if fsm.original is None else None,
                [s.name for s in fsm.trace])
        await conn.drain()
        return source.done
    finally:
        _in_flight -= 1


def _answer(conn: FrameStream, journal: str, resp: AppendResponse, started: float,
            wrote: Fragment | None, trace: object, whole: bool = False) -> None:
    """Count the append, log a failure, and send the answer now (one writelines: there
    is nothing to coalesce it with). `wrote`: the span this append wrote, if it did;
    `whole`: the whole-append lane served it."""
    if resp.status == Status.OK:
        metrics.HOT.appended(wrote.end - wrote.begin if wrote is not None else 0,
                             time.monotonic() - started, whole)
    else:
        _appends_counter(resp.status.name).inc()
        if resp.status != Status.ABORTED:
            log.info("append failed", journal=journal,
                     status=resp.status.name, message=resp.message, trace=trace)
    conn.send_encoded(encode_frame(resp))


def _peer_auth(broker: object, journal: str) -> dict:
    peer_auth = getattr(broker, "peer_auth", None)
    return peer_auth(Capability.APPEND, journal) if peer_auth is not None else {}


async def proxy_append(conn: AnswerSink, req: AppendRequest, res, source: ProxiedSource,  # noqa: ANN001
                       peer: dict | None = None, broker: object | None = None) -> bool | None:
    """Forward the append to the primary, with our resolution as its header, presenting
    our own derived APPEND token for the journal (`peer`: Host.peer_auth), never the
    client's. A primary that cannot be reached is looked for again (`_reach_primary`);
    None: the journal's primary is now this coordinator (nothing answered, nothing read
    from `source`: the caller runs the append here)."""
    peer = peer or {}
    upstream: FrameStream | None = None
    forwarded = 0  # content bytes forwarded: a zero-byte append (a barrier) commits nothing
    # Once the AppendCommit of some content was written upstream, a broken upstream means
    # the primary may have committed: the answer is COMMIT_UNKNOWN, not UNAVAILABLE.
    commit_sent = False
    upstream, res, refusal = await _reach_primary(broker, req.journal, res, peer)
    endpoint = res.route.primary_endpoint
    if upstream is None and refusal.action is Reproxy.LOCAL:
        return None
    if upstream is None:
        await conn.send(AppendResponse(status=refusal.status, header=res.header,
                                       message=refusal.message))
        return False  # the client's content is unread: the connection is out of step
    try:
        upstream.write(AppendRequest(
            journal=req.journal, header=res.header, do_not_proxy=True, offset=req.offset,
            check_registers=req.check_registers, union_registers=req.union_registers,
            subtract_registers=req.subtract_registers, suspend=req.suspend,
            min_etcd_revision=req.min_etcd_revision, producer=req.producer,
            generation=req.generation, history=req.history, txn=req.txn,
            close_history=req.close_history, roll_below=req.roll_below))
        try:
            while True:
                chunk = await source.next_chunk()
                if chunk is None:
                    commit_sent = forwarded > 0
                    upstream.write(AppendCommit())
                    break
                upstream.write(AppendChunk(), chunk)
                forwarded += len(chunk)
                await upstream.drain()
        except AppendAborted as aborted:
            upstream.abort()  # closing mid-stream rolls the append back at the primary
            upstream = None
            await conn.send(AppendResponse(status=Status.ABORTED, header=res.header, message=aborted.reason))
            return source.done
        await upstream.drain()
        async with asyncio.timeout(PROXY_TIMEOUT):
            resp, _ = await upstream.read_message(AppendResponse)
        await conn.send(resp)
        return source.done
    except (OSError, ProtocolError, asyncio.TimeoutError) as exc:
        # Before the commit was forwarded the primary rolls the append back when our
        # stream ends: definite. After it, the primary may have committed.
        d = decide_broken(commit_sent, f"proxy to primary {endpoint} failed: {exc!r}")
        await conn.send(AppendResponse(status=d.status, header=res.header, message=d.message))
        return False
    finally:
        if upstream is not None:
            await upstream.close()


async def _reach_primary(broker, journal: str, res, peer: dict):  # noqa: ANN001, ANN202
    """A handshaken connection to the journal's primary: (upstream, resolution, None), or
    (None, resolution, refusal). Nothing of the append is sent before it is reached, so a
    primary that does not answer (dead, or its host isolated: a silent link) is given up
    after a short connect timeout and the journal resolved again from our own etcd
    mirror — the watch names a new primary once the old one's lease expired — within
    twice the lease TTL + 2 s (proxy_rules.decide_reproxy)."""
    endpoint = res.route.primary_endpoint or ""
    cfg = getattr(broker, "cfg", None)
    keyspace = getattr(broker, "keyspace", None)
    budget = reproxy_budget(float(getattr(cfg, "lease_ttl", 0.0))) if broker is not None else 0.0
    deadline = time.monotonic() + budget
    failed = endpoint
    while True:
        attempt = time.monotonic()
        if endpoint:
            upstream = await connect_member([endpoint], peer)
            if upstream is not None:
                if endpoint != failed:
                    log.info("append re-proxied to a new primary", journal=journal,
                             unreachable=failed, primary=endpoint)
                return upstream, res, None
            failed = endpoint
        while True:
            now = time.monotonic()
            if broker is None:
                return None, res, ReproxyDecision(
                    Reproxy.ANSWER, status=Status.UNAVAILABLE,
                    message=f"proxy to primary {failed} failed: unreachable")
            if deadline > now:
                pause = max(0.05, min(deadline - now, attempt + _CONNECT_PACE - now))
                if keyspace is not None:  # woken by a new route, else paced
                    await keyspace.wait_changed(res.revision, pause)
                else:
                    await asyncio.sleep(pause)
            fresh = await broker.resolve(journal)
            now = time.monotonic()
            complete = fresh.spec is None or len(fresh.route.members) >= fresh.spec.replication
            d = decide_reproxy(fresh.status, fresh.is_primary, fresh.primary_endpoint, failed,
                               now - attempt, deadline - now, complete)
            if fresh.status == Status.OK:
                res = fresh
            if d.action is Reproxy.ANSWER or d.action is Reproxy.LOCAL:
                return None, res, d
            if d.action is Reproxy.PROXY:
                endpoint = d.endpoint
                break
