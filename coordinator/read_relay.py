"""Reads another coordinator serves for us: a proxied read (we are not a member of the
journal's route) and a member's own gap filled from its peers (bytes below our write
head that we do not hold: our spool was lost in a crash and a sync rolled us past
them). Both relay the upstream's frames with one loop, `relay`, and stream persisted
fragments themselves when the upstream hands out a URL (`stream_stored`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from protocol import ReadContent, ReadRequest, ReadResponse, Status
from protocol.auth import Capability
from protocol.errors import ProtocolError
from protocol.logs import get_logger
from protocol.stream import FrameStream

from .held_copies import Extra, held_copies
from .peer_connect import connect_member

log = get_logger(__name__)

METADATA_SENT = -1
"""fill_gap's answer when a metadata-only read was answered by a peer."""
READ_CHUNK = 1 << 17


def journal_stores(broker, journal: str) -> tuple[str, ...]:  # noqa: ANN001
    """The journal's `fragment.stores` (other copies a corrupt object is read from)."""
    keyspace = getattr(broker, "keyspace", None)
    entry = keyspace.journals.get(journal) if keyspace is not None else None
    return tuple(entry.spec.fragment.stores) if entry is not None else ()


class StoredCorrupt(Exception):
    """Every copy of a persisted fragment failed its proof; `.response` is the
    FRAGMENT_CORRUPT answer to send the reader (no byte of the fragment was sent)."""

    def __init__(self, response: ReadResponse) -> None:
        super().__init__(response.message)
        self.response = response


class ColdReadAhead:
    """The next persisted fragment of one cold read, proven on a thread while the current
    one is streamed (fragment_store.readahead's idea, inside one read RPC). At most one
    fragment ahead: a cold read holds at most two fragments' proven content (each bounded
    by fragment_store's spill bound, QUIRE_VERIFY_SPILL_BYTES in memory). What was read
    ahead is handed on only through `take`, i.e. after its proof, and released (closed)
    when the read moves elsewhere or ends."""

    def __init__(self) -> None:
        self.frag = None
        self.task: asyncio.Future | None = None

    def start(self, frag, stores: tuple[str, ...], held: Sequence[Extra]) -> None:  # noqa: ANN001
        from fragment_store.verified import read_verified

        self.drop()
        self.frag = frag
        self.task = asyncio.ensure_future(asyncio.to_thread(
            read_verified, frag, frag.begin, stores=stores, extra=held, chunk=READ_CHUNK))

    async def take(self, frag, offset: int):  # noqa: ANN001, ANN201
        """`frag`'s proven chunks from `offset`, if it is what was read ahead (from its
        begin); else None. Raises what its read raised (FragmentCorrupt, StoreError)."""
        task, ahead = self.task, self.frag
        self.task = self.frag = None
        if task is None:
            return None
        if ahead != frag or offset != frag.begin:
            _discard(task)
            return None
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            _discard(task)
            raise

    def drop(self) -> None:
        if self.task is not None:
            _discard(self.task)
        self.task = self.frag = None


def _discard(task: asyncio.Future) -> None:
    """Release a read-ahead nobody takes: its proven content is closed once the proof ends
    (a thread cannot be interrupted; its error, if any, is dropped)."""

    def close(done: asyncio.Future) -> None:
        if not done.cancelled() and done.exception() is None:
            done.result().close()

    task.add_done_callback(close)


async def stream_stored(conn: FrameStream, frag, offset: int, end_offset: int,  # noqa: ANN001
                        stores: tuple[str, ...] = (), held: Sequence[Extra] = (),
                        ahead: ColdReadAhead | None = None,
                        read_next: Callable[[], None] | None = None) -> int:
    """Send a persisted fragment's content from `offset` (up to `end_offset`, if set) as
    ReadContent frames, fetched by us through fragment_store's verifying reader: the
    whole object is proven by its SHA-1 before the first frame, a corrupt copy is
    quarantined and replaced by another of the journal's `stores`, else by a copy a
    member still holds (`held`: held_copies.py), and mended from it. `ahead`: the read's
    read-ahead, taken if it holds this fragment; `read_next`, called once this one is
    proven, starts proving the next one while this one is sent.
    Raises StoredCorrupt where no good copy exists; returns the offset reached."""
    from fragment_store.verified import FragmentCorrupt, read_verified

    try:
        chunks = await ahead.take(frag, offset) if ahead is not None else None
        if chunks is None:
            chunks = await asyncio.to_thread(read_verified, frag, offset, stores=stores,
                                             extra=held, chunk=READ_CHUNK)
    except FragmentCorrupt as exc:
        log.error("persisted fragment corrupt in every store", journal=frag.journal,
                  fragment=exc.fragment, stores=list(exc.stores))
        raise StoredCorrupt(ReadResponse(status=Status.FRAGMENT_CORRUPT, offset=offset,
                                         message=str(exc))) from None
    stop = min(frag.end, end_offset) if end_offset else frag.end
    sentinel = b""
    try:
        if read_next is not None:
            read_next()  # proven: the next fragment (if from the store too) is proven meanwhile
        while offset < stop:
            data = await asyncio.to_thread(next, chunks, sentinel)
            if not data:
                break
            data = data[:stop - offset]
            conn.write(ReadContent(offset=offset), data)
            offset += len(data)
            await conn.drain()
    finally:
        chunks.close()
    return offset


async def relay(conn: FrameStream, upstream: FrameStream, req: ReadRequest, header,  # noqa: ANN001
                 offset: int, *, end_offset: int, held_only: bool = False,
                 lineage: tuple[tuple[int, int], ...] = (),
                 relay_refusal: bool = True,
                 stores: tuple[str, ...] = (),
                 copies: Callable[..., Sequence[Extra]] | None = None) -> tuple[int, Status | None]:
    """Read [offset, end_offset) (0: no end) at `upstream` with `do_not_proxy`, relaying
    its frames to `conn`; returns the offset reached and how the upstream's RPC ended.

    `do_not_proxy` also tells the upstream the reader fetches persisted fragments itself:
    for such a fragment it answers with the URL and ends its RPC. Our reader did not ask
    for that, so we stream the fragment from the store ourselves and ask again from its
    end (other copies: `stores`, the journal's; then `copies(fragment)`, members' held
    copies). A non-OK answer ends the relay (relayed only if `relay_refusal`); a failed
    upstream connection ends it with None."""
    while True:
        await upstream.send(ReadRequest(
            journal=req.journal, header=header, offset=offset,
            block=req.block and not held_only, do_not_proxy=True,
            metadata_only=req.metadata_only, end_offset=end_offset,
            begin_mod_time=req.begin_mod_time, held_only=held_only, lineage=lineage))
        while True:
            try:
                frame = await upstream.read()
            except ProtocolError:
                return offset, None
            msg = frame.message
            if isinstance(msg, ReadResponse) and msg.status != Status.OK:
                if relay_refusal:
                    conn.write(msg, frame.payload)
                    await conn.drain()
                return offset, msg.status
            conn.write(msg, frame.payload)
            await conn.drain()
            if isinstance(msg, ReadResponse):
                if req.metadata_only:
                    return offset, Status.OK
                offset = msg.offset
                if msg.fragment_url and msg.fragment is not None:
                    try:
                        offset = await stream_stored(
                            conn, msg.fragment, offset, end_offset, stores,
                            copies(msg.fragment) if copies is not None else ())
                    except StoredCorrupt as exc:
                        await conn.send(exc.response)
                        return offset, Status.FRAGMENT_CORRUPT
                    break  # the upstream ended its RPC at the URL: ask again from here
            elif isinstance(msg, ReadContent):
                offset = msg.offset + len(frame.payload)
            if end_offset and offset >= end_offset:
                return offset, Status.OK
        if end_offset and offset >= end_offset:
            return offset, Status.OK


async def proxy_read(conn: FrameStream, req: ReadRequest, res, peer: dict | None = None,  # noqa: ANN001
                     stores: tuple[str, ...] = ()) -> bool:
    """Forward to a member with our derived READ token (`peer`: Host.peer_auth); the
    member is asked with `do_not_proxy` (no second hop). We end our RPC where the
    member's ends: a non-OK status, metadata only, `end_offset` reached."""
    upstream = await connect_member(res.route.endpoints, peer or {})
    if upstream is None:
        await conn.send(ReadResponse(status=Status.UNAVAILABLE, header=res.header,
                                     message="no member of the route is reachable"))
        return True
    try:
        _, ended = await relay(conn, upstream, req, res.header, req.offset,
                                end_offset=req.end_offset, stores=stores,
                                copies=lambda f: held_copies(f, res.route.endpoints, peer or {}))
        return ended is not None  # a member lost mid-read: our reader retries elsewhere
    finally:
        await upstream.close()


def gap_holders(broker, route, me) -> list[str]:  # noqa: ANN001
    """Who may hold a member's gap: the route's other members first, then every other
    live member — a former member (the primary the route just dropped) keeps the
    content only it had (an exposed tail the sync rolled the others past) until its
    fragments are persisted, and until then no one else can serve it (campaign seed 3:
    a consumer's read skipped one such append and its counts came out short). A former
    member is asked with our epoch history (`lineage`): it may also hold a tail a later
    epoch cut and rewrote, which it must not serve as ours."""
    peers = [e for _, e in route.peers(me)]
    members = getattr(getattr(broker, "keyspace", None), "members", None) or {}
    others = sorted(m.spec.endpoint for pid, m in members.items()
                    if pid != me and pid not in route.members and m.spec.endpoint)
    return peers + [e for e in others if e not in peers]


async def fill_gap(broker, conn: FrameStream, req: ReadRequest, res, offset: int,  # noqa: ANN001
                    gap_end: int, lineage: tuple[tuple[int, int], ...] = ()) -> int | None:
    """Relay [offset, gap_end) from the members that hold it (`gap_holders`), each asked
    `held_only` from where the last one stopped (one that fails mid-relay too); returns
    the offset reached (== offset: no one holds it), None if our reader's connection
    failed, or METADATA_SENT when a metadata-only read was answered by a peer.
    `lineage`: our epoch history, sent to former members (see gap_holders)."""
    me = getattr(broker, "me", None)
    peer_auth = getattr(broker, "peer_auth", None)
    auth = peer_auth(Capability.READ, req.journal) if peer_auth else {}
    for endpoint in gap_holders(broker, res.route, me):
        if offset >= gap_end:
            break
        former = endpoint not in res.route.endpoints
        if former and not lineage:
            continue  # without our epoch history a former member's bytes cannot be checked
        upstream = await connect_member([endpoint], auth)
        if upstream is None:
            continue
        try:
            reached, ended = await relay(conn, upstream, req, res.header, offset,
                                          end_offset=gap_end, held_only=True,
                                          lineage=lineage if former else (),
                                          relay_refusal=False,
                                          stores=journal_stores(broker, req.journal),
                                          copies=lambda f: held_copies(
                                              f, [e for _, e in res.route.peers(me)], auth))
        except (ConnectionError, OSError):
            return None
        finally:
            await upstream.close()
        if req.metadata_only and ended == Status.OK:
            return METADATA_SENT
        if reached > offset:
            log.info("read gap filled from a peer", journal=req.journal, begin=offset,
                     end=reached, peer=endpoint, former_member=former)
            offset = reached
    return offset
