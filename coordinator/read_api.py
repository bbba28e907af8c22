"""Reads, fragment fetches and fragment listings at the coordinator.

A read streams committed bytes only: from the spool (up to the published head), from
closed local fragments, or — once persisted — from the store (streamed by us, or handed
to the client as `fragment_url` when it asked `do_not_proxy`). A blocking read parks on
the replica's wake-up future, which the spool's commit observer (or the pipeline's
acknowledgement) resolves: no polling.

Gaps: a member can lack committed bytes below its write head — after a crash its open
spool is dropped and a sync rolls it forward past bytes only its peers (or, once
persisted, the store) hold. Such a gap is filled from the peers, and from former
members that still hold it (`held_only` reads relayed to the reader); a blocking read
waits up to GAP_WAIT for the index to cover what no one holds, and only then — pruned,
or lost by every replica — skips it, the reader's offset jumping to the next readable
byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from protocol.logs import get_logger
from protocol import (
    FetchFragmentRequest,
    FetchFragmentResponse,
    FragmentContent,
    FragmentInfo,
    ListFragmentsRequest,
    ListFragmentsResponse,
    ReadContent,
    ReadRequest,
    ReadResponse,
    Status,
)
from protocol.auth import Capability
from protocol.errors import ProtocolError
from protocol.stream import FrameStream

from . import metrics
from .held_copies import held_copies
from .readback import check_copy, lose_copy
from .read_relay import (
    METADATA_SENT,
    ColdReadAhead,
    READ_CHUNK,
    StoredCorrupt,
    connect_member,
    fill_gap,
    journal_stores,
    proxy_read,
    stream_stored,
)
from .replica import lineage_agrees_until
from .spool_health import reason_of

log = get_logger(__name__)

GAP_WAIT = 10.0
"""Seconds a blocking read waits for a gap no member holds to show up in the index
(a former member persisting it) before it skips the gap as lost."""

FETCH_CHUNK = 1 << 20


async def serve_read(broker, conn: FrameStream, req: ReadRequest) -> bool:  # noqa: ANN001
    hdr_rev = req.header.etcd.revision if req.header else 0
    res = await broker.resolve(req.journal, max(hdr_rev, req.min_etcd_revision))
    if res.status != Status.OK:
        await conn.send(ReadResponse(status=res.status, header=res.header))
        return True
    if not res.spec.readable:
        await conn.send(ReadResponse(status=Status.NOT_ALLOWED, header=res.header,
                                     message="journal is write-only"))
        return True
    held = getattr(broker, "replicas", {}).get(req.journal) if req.held_only else None
    if not res.is_member and held is None:
        if req.do_not_proxy or not res.route.endpoints:
            await conn.send(ReadResponse(status=Status.NOT_JOURNAL_BROKER, header=res.header))
            return True
        peer_auth = getattr(broker, "peer_auth", None)
        return await proxy_read(conn, req, res,
                                peer_auth(Capability.READ, req.journal) if peer_auth else None,
                                journal_stores(broker, req.journal))
    # A member's own replica; or, for a gap read (held_only), what a former member
    # still holds of the journal (kept until persisted: read_relay.gap_holders).
    replica = held if held is not None else broker.replica(req.journal)
    if held is None and not res.current and (req.offset == -1 or req.offset >= replica.write_head):
        # Our head may predate what happened while our lease was unconfirmed or our
        # watch was behind (a new primary, its appends): we do not tell it, and do not
        # wait at it. Bytes below it were committed and are served as usual.
        await conn.send(ReadResponse(
            status=Status.UNAVAILABLE, header=res.header,
            message=f"member {res.header.process_id} cannot vouch for the write head of "
                    f"{req.journal}: its lease is unconfirmed or its view of etcd is catching "
                    f"up; ask another member"))
        return True
    if held is None and req.offset == -1 and not _synced_on_route(broker, replica, res):
        # Current, but our spool was not synchronized on this route yet (a member the
        # route took back after an absence still holds its old head until the primary's
        # sync reaches it): its head is not the journal's to tell.
        await conn.send(ReadResponse(
            status=Status.UNAVAILABLE, header=res.header,
            message=f"member {res.header.process_id} has not been synchronized on the "
                    f"current route of {req.journal} yet; ask another member"))
        return True
    gone = _Gone(conn)
    ahead = ColdReadAhead()
    try:
        keep = await _stream(broker, conn, req, res, replica, gone, ahead)
    finally:
        ahead.drop()  # a fragment proven ahead that the read never reached is released
        intact = await gone.stop()
    return keep and intact


def _synced_on_route(broker, replica, res) -> bool:  # noqa: ANN001
    """Our spool was synchronized on the journal's current route: as its primary, by
    our own synced pipeline on it; as a replica, by that route's replicate stream. (Only
    with a topology: replicate streams are tracked by their route only then.)"""
    if getattr(getattr(broker, "topology", None), "resolver", None) is None:
        return True
    if res.is_primary:
        pln = replica.pipeline
        return pln is not None and pln.synced and pln.broken is None \
            and pln.route.equivalent(res.route)
    stream = replica.stream
    return stream is not None and stream[0].route.equivalent(res.route)


class _Gone:
    """A client that goes away while we block must not leave us waiting forever: the
    connection carries nothing else during a blocking read, so any byte or EOF ends it.

    The watch (a pending `wait_readable()` on the connection) exists only while we block,
    and is cancelled *and awaited* before the connection's next RPC is read: a watch
    still pending would make that read fail (one waiter per connection). A read that
    ends without blocking never starts one."""

    def __init__(self, conn: FrameStream) -> None:
        self.conn = conn
        self.task: asyncio.Future[None] | None = None

    def watch(self) -> asyncio.Future[None]:
        if self.task is None:
            self.task = asyncio.ensure_future(self.conn.wait_readable())
        return self.task

    async def stop(self) -> bool:
        """End the watch; False if it saw a byte or EOF (the connection is done)."""
        task, self.task = self.task, None
        if task is None:
            return True
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        return task.cancelled()


async def _stream(broker, conn: FrameStream, req: ReadRequest, res, replica, gone: _Gone,  # noqa: ANN001
                  ahead: ColdReadAhead) -> bool:
    offset = replica.write_head if req.offset == -1 else req.offset
    first = True
    asked_peers_at = -1
    gap_since: dict[int, float] = {}
    loop = asyncio.get_running_loop()
    while True:
        if req.end_offset and offset >= req.end_offset:
            return True
        found = replica.lookup(offset)
        if found is None:
            jump = replica.next_offset_after_gap(offset)
            below_head = offset < replica.write_head
            if below_head and not req.held_only and asked_peers_at != offset:
                # Written (below the head) but not here: a peer may hold it.
                asked_peers_at = offset
                gap_end = min(e for e in (jump, replica.write_head, req.end_offset or None)
                              if e is not None)
                reached = await fill_gap(broker, conn, req, res, offset, gap_end,
                                         lineage=replica.spool.epochs)
                if reached is None:
                    return False  # the reader went away while we relayed
                if reached == METADATA_SENT:
                    return True
                if reached > offset:
                    offset, first = reached, False
                    continue
            if jump is not None and below_head and not req.held_only:
                if req.block and gap_since.setdefault(offset, loop.time()) + GAP_WAIT > loop.time():
                    # No one holds them *yet* in our view: a former member may be
                    # persisting them, and our index learns of it only then. A blocking
                    # reader waits (bounded) for the index, asking the members again.
                    await replica.wait_change(1.0)
                    asked_peers_at = -1
                    continue
                offset = jump  # no member holds these bytes (pruned, or lost by all)
                continue
            if not req.block or req.held_only:
                await conn.send(ReadResponse(status=Status.OFFSET_NOT_YET_AVAILABLE,
                                             header=res.header if first else None,
                                             offset=offset, write_head=replica.write_head))
                return True
            # Made before we yield: a commit landing in between still wakes us.
            change = replica.changed()
            watch = gone.watch()
            done, _ = await asyncio.wait({change, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done:
                return False  # EOF, or a byte we consumed: the connection cannot go on
            continue
        frag, local = found
        stop = min(frag.end, req.end_offset) if req.end_offset else frag.end
        if req.lineage:
            # A former member asked for a gap: only bytes of the asker's lineage, and
            # only what is on our disk (the asker's own index covers the store).
            persisted = frag.is_persisted and local is None and frag != replica.spool.fragment
            stop = offset if persisted else min(stop, lineage_agrees_until(
                req.lineage, replica.spool.epochs, offset, stop))
            if stop <= offset:
                await conn.send(ReadResponse(status=Status.OFFSET_NOT_YET_AVAILABLE,
                                             header=res.header if first else None,
                                             offset=offset, write_head=replica.write_head))
                return True
        if frag.is_persisted and local is None and frag != replica.spool.fragment:
            stores = journal_stores(broker, req.journal)
            ok = await _persisted(conn, req, res, replica, frag, offset, first, stores,
                                  _held(broker, res, frag), ahead,
                                  lambda f=frag, s=stores: _read_next(broker, req, res, replica,
                                                                      f, s, ahead))
            if not ok:
                return True
            first = False
            offset = frag.end
            continue
        await conn.send(ReadResponse(header=res.header if first else None, offset=offset,
                                     write_head=replica.write_head, fragment=frag))
        first = False
        if req.metadata_only:
            return True
        while offset < stop:
            data = replica.read_local(frag, local, offset, min(READ_CHUNK, stop - offset))
            if not data:
                break  # at the head, or the spool rolled: look the offset up again
            conn.write(ReadContent(offset=offset), data)
            offset += len(data)
            metrics.READ_BYTES.inc(len(data))
            await conn.drain()


def _held(broker, res, frag) -> list:  # noqa: ANN001
    """The route's other members' held copies of `frag` (held_copies.py)."""
    peer_auth = getattr(broker, "peer_auth", None)
    return held_copies(frag, [e for _, e in res.route.peers(getattr(broker, "me", None))],
                       lambda: peer_auth(Capability.READ, frag.journal) if peer_auth else {})


def _read_next(broker, req: ReadRequest, res, replica, frag, stores: tuple[str, ...],  # noqa: ANN001
               ahead: ColdReadAhead) -> None:
    """Start proving the fragment after `frag` (ColdReadAhead) if this read will stream it
    from the store too: it follows `frag` directly, only the store holds it, and the
    read does not end within `frag`."""
    if req.lineage or (req.end_offset and req.end_offset <= frag.end):
        return
    found = replica.lookup(frag.end)
    if found is None:
        return
    nxt, local = found
    if local is None and nxt.is_persisted and nxt != replica.spool.fragment \
            and nxt.begin == frag.end:
        ahead.start(nxt, stores, _held(broker, res, nxt))


async def _persisted(conn: FrameStream, req: ReadRequest, res, replica, frag, offset: int,  # noqa: ANN001
                     first: bool, stores: tuple[str, ...] = (), held: list | None = None,
                     ahead: ColdReadAhead | None = None,
                     read_next: Callable[[], None] | None = None) -> bool:
    """A fragment only the store holds: hand out its URL, or stream it ourselves (proven
    first; `stores`: the journal's, where other copies are; `held`: the copies the
    route's other members still hold, asked only when every store's copy is rotten;
    `ahead` / `read_next`: the next fragment is proven while this one is streamed)."""
    from fragment_store.keys import fragment_key
    from fragment_store.stores import open_store

    store = open_store(frag.backing_store)
    key = fragment_key(frag)
    url = ""
    try:
        url = store.signed_url(key, 60.0)
    except Exception:  # noqa: BLE001 - a store without signing: we stream instead
        pass
    await conn.send(ReadResponse(header=res.header if first else None, offset=offset,
                                 write_head=replica.write_head, fragment=frag, fragment_url=url))
    if req.metadata_only or (req.do_not_proxy and url):
        return False
    try:
        offset = await stream_stored(conn, frag, offset, req.end_offset, stores, held or (),
                                     ahead, read_next)
    except StoredCorrupt as exc:
        await conn.send(exc.response)
        return False
    return not (req.end_offset and offset >= req.end_offset)


async def serve_fetch(broker, conn: FrameStream, req: FetchFragmentRequest) -> bool:  # noqa: ANN001
    """Raw bytes of a closed local fragment (persist workers fetch them from us)."""
    replica = broker.replicas.get(req.fragment.journal)
    lf = replica.local_file(req.fragment) if replica is not None else None
    if lf is None or lf.file is None:
        await conn.send(FetchFragmentResponse(status=Status.JOURNAL_NOT_FOUND if replica is None
                                              else Status.OFFSET_NOT_YET_AVAILABLE,
                                              message="no such closed fragment here"))
        return True
    # Read back and checked first: a copy that is short, corrupt or unreadable is
    # dropped as lost here and never handed out (readback.py).
    why = await check_copy(broker, replica, lf)
    if why:
        await conn.send(FetchFragmentResponse(status=Status.OFFSET_NOT_YET_AVAILABLE,
                                              message=f"this member's copy is lost: {why}"))
        return True
    await conn.send(FetchFragmentResponse())
    size, pos = lf.fragment.end - lf.fragment.begin, 0
    while pos < size:
        try:
            data = lf.file.read_at(pos, min(FETCH_CHUNK, size - pos))
        except OSError as exc:
            lose_copy(broker, replica, lf, reason_of(exc), f"{type(exc).__name__}: {exc}")
            return False  # no end-of-content frame: the worker never takes it as whole
        if not data:
            lose_copy(broker, replica, lf, "length", f"{pos} bytes read, the fragment has {size}")
            return False
        conn.write(FragmentContent(), data)
        pos += len(data)
        await conn.drain()
    await conn.send(FragmentContent())
    return True


async def serve_list_fragments(broker, conn: FrameStream, req: ListFragmentsRequest) -> bool:  # noqa: ANN001
    res = await broker.resolve(req.journal, 0)
    if res.status != Status.OK:
        await conn.send(ListFragmentsResponse(status=res.status, header=res.header))
        return True
    if not res.is_member:
        # We hold nothing of this journal: a member's listing, not an empty one.
        peer_auth = getattr(broker, "peer_auth", None)
        upstream = await connect_member(res.route.endpoints,
                                         peer_auth(Capability.READ, req.journal) if peer_auth else {})
        if upstream is None:
            await conn.send(ListFragmentsResponse(status=Status.UNAVAILABLE, header=res.header))
            return True
        try:
            await upstream.send(req)
            async with asyncio.timeout(30.0):
                answer, _ = await upstream.read_message(ListFragmentsResponse)
        except (ProtocolError, asyncio.TimeoutError):
            answer = ListFragmentsResponse(status=Status.UNAVAILABLE, header=res.header)
        finally:
            await upstream.close()
        await conn.send(answer)
        return True
    replica = broker.replicas.get(req.journal)
    frags: dict[tuple[int, int, str], FragmentInfo] = {}
    if replica is not None:
        for f in replica.remote:
            frags[(f.begin, f.end, f.sum)] = FragmentInfo(spec=f)
        for lf in replica.local:
            f = lf.fragment
            key = (f.begin, f.end, f.sum)
            frags[key] = FragmentInfo(spec=frags[key].spec if key in frags else f, local=True)
        if replica.spool.fragment.end > replica.spool.fragment.begin:
            f = replica.spool.fragment
            frags[(f.begin, f.end, f.sum)] = FragmentInfo(spec=f, local=True)
    ordered = [v for k, v in sorted(frags.items()) if k[0] >= req.next_page_token]
    limit = max(1, min(req.page_limit or 1000, 10000))
    page, rest = ordered[:limit], ordered[limit:]
    await conn.send(ListFragmentsResponse(header=res.header, fragments=tuple(page),
                                          next_page_token=rest[0].spec.begin if rest else 0))
    return True
