"""A former member's closed fragment is checked against the journal before it is persisted.

A replica publishes every commit it adopts, before the primary has every peer's
acknowledgement. If the primary then fails, and the route is rebuilt without this
replica, the new route synchronizes at the end its members hold and a later epoch
writes *other* bytes at the offsets of that tail (its commit never reached them; the
append's client was told COMMIT_UNKNOWN, or nothing). The former member still holds
the old tail; retiring, it closes its spool as a fragment and — before this check —
handed it to the persister at once: the store then held two fragments with different
bytes at the same offsets (a forked journal; a reader of the store could get either).

So a fragment closed by retirement (`Replica.retired`) is first compared with what
the route's members hold at its offsets (a `held_only` read: their spool, local
fragments and the store, never a relay from someone else — in particular not from us).
Bytes of one epoch at one offset are the same wherever they are held, so the first
byte that differs is where a later epoch cut our tail and rewrote it: the fragment is
dropped locally, never uploaded, counted (`quire_stale_fragments_dropped_total`) and
logged with the offset and the member that holds the journal's bytes. Offsets no member
of the route holds yet (an exposed tail the sync rolled them past, a route rebuilt from
members that never held the journal) are not a disagreement: such a fragment may be the
only copy of acknowledged content and is persisted as before.

Limit: the check is made once, when the fragment closes. A new route that writes at
those offsets only after this member retired and persisted its tail meets the tail in
the fragment index first (INDEX_HAS_GREATER_OFFSET, then reset-head) unless the index
refresh lags behind its first append (docs/reliability.md, finding 10).
"""

from __future__ import annotations

import asyncio
import hashlib

from protocol import Fragment, ReadContent, ReadRequest, ReadResponse, Status
from protocol.auth import Capability
from protocol.errors import ProtocolError
from protocol.logs import get_logger

from .read_relay import StoredCorrupt, connect_member, stream_stored
from .replica import Replica

log = get_logger(__name__)

CHECK_TIMEOUT = 30.0
"""Seconds one route member gets to serve a fragment's offsets."""


class _Collect:
    """A FrameStream's write side that keeps what `stream_stored` sends (a persisted
    fragment a member handed out as a URL: we fetch it from the store ourselves)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, bytes]] = []

    def write(self, msg: ReadContent, payload: bytes | memoryview) -> None:
        self.chunks.append((msg.offset, bytes(payload)))

    async def drain(self) -> None:
        return None


def first_difference(ours: bytes, begin: int, offset: int, theirs: bytes) -> int | None:
    """The journal offset of the first byte of `theirs` (held by a member from `offset`)
    that differs from `ours` (our fragment's bytes from `begin`); None if none does."""
    at = offset - begin
    mine = ours[at:at + len(theirs)]
    if mine == theirs[:len(mine)]:
        return None
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return offset + i
    return offset + len(mine)  # (unreachable: equal prefixes of equal length)


async def _member_disagrees(endpoint: str, auth: dict, fragment: Fragment, ours: bytes,
                            header) -> int | None:  # noqa: ANN001
    """Read the fragment's offsets `held_only` at one member; the first offset whose byte
    differs from ours, or None (it agrees as far as it holds them, or is unreachable)."""
    upstream = await connect_member([endpoint], auth)
    if upstream is None:
        return None
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            offset = fragment.begin
            while offset < fragment.end:
                await upstream.send(ReadRequest(journal=fragment.journal, header=header,
                                                offset=offset, end_offset=fragment.end,
                                                do_not_proxy=True, held_only=True))
                again = False
                while offset < fragment.end and not again:
                    frame = await upstream.read()
                    msg = frame.message
                    if isinstance(msg, ReadResponse):
                        if msg.status != Status.OK:
                            return None  # it holds nothing more: no disagreement there
                        if msg.fragment_url and msg.fragment is not None:
                            sink, before = _Collect(), offset
                            try:
                                await stream_stored(sink, msg.fragment, msg.offset, fragment.end)
                            except StoredCorrupt:
                                return None  # no proven copy to compare with
                            for at, data in sink.chunks:
                                diff = first_difference(ours, fragment.begin, at, data)
                                if diff is not None:
                                    return diff
                                offset = at + len(data)
                            if offset <= before:
                                return None
                            again = True  # the member ended its RPC at the URL
                    elif isinstance(msg, ReadContent):
                        data = bytes(frame.payload)
                        diff = first_difference(ours, fragment.begin, msg.offset, data)
                        if diff is not None:
                            return diff
                        offset = msg.offset + len(data)
            return None
    except (ProtocolError, OSError, TimeoutError) as exc:
        log.info("cannot compare a retired fragment with a route member", endpoint=endpoint,
                 journal=fragment.journal, error=repr(exc))
        return None
    finally:
        upstream.abort()


async def stale_from(host, replica: Replica, fragment: Fragment) -> tuple[int, str] | None:  # noqa: ANN001
    """(offset, member) where a member of the journal's current route holds bytes other
    than the fragment's — a tail a later epoch replaced — or None."""
    resolver = getattr(getattr(host, "topology", None), "resolver", None)
    if resolver is None:
        return None
    res = resolver.resolve_now(fragment.journal)
    if res.status != Status.OK or res.is_member:
        return None  # deleted (nothing will persist it), or ours again (synced as a member)
    local = replica.local_file(fragment)
    if local is None or local.file is None:
        return None
    ours = await asyncio.to_thread(local.file.read_at, 0, fragment.end - fragment.begin)
    if len(ours) != fragment.end - fragment.begin \
            or hashlib.sha1(ours).hexdigest() != fragment.sum:
        return None  # not ours to judge: the persist worker's SHA-1 check refuses it
    auth = host.peer_auth(Capability.READ, fragment.journal)
    for pid, endpoint in zip(res.route.members, res.route.endpoints):
        if pid == host.me or not endpoint:
            continue
        at = await _member_disagrees(endpoint, auth, fragment, ours, res.header)
        if at is not None:
            return at, str(pid)
    return None
