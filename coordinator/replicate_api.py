"""The Replicate RPC at a replica: a long-lived stream from the journal's primary.

The first proposal carries the primary's header (route + etcd revision). The replica
waits for that revision, checks it is a member (else NOT_JOURNAL_BROKER) and that its
own route is equivalent (else WRONG_ROUTE with its own header, so the primary can tell
who is behind), then takes the spool — blocking while another stream owns it — and
applies every message in order. Only acknowledged proposals are answered. The stream's
end, however it comes, rolls back uncommitted bytes and releases the spool.
"""

from __future__ import annotations

import asyncio

from quire.logs import get_logger
from quire.protocol import ReplicateContent, ReplicateProposal, ReplicateResponse, Status
from quire.protocol.errors import ProtocolError
from quire.protocol.stream import FrameStream

from .spool import SpoolError

log = get_logger(__name__)

SPOOL_TIMEOUT = 30.0


async def serve_replicate(broker, conn: FrameStream, first: ReplicateProposal) -> bool:  # noqa: ANN001
    """Serve a replicate stream until the primary closes it. Never reuses the connection."""
    hdr = first.header
    journal = first.proposal.journal
    if hdr is None:
        await conn.send_error("the first replicate message must carry a header")
        return False
    res = await broker.resolve(journal, hdr.etcd.revision)
    if res.status != Status.OK:
        await conn.send(ReplicateResponse(status=res.status, header=res.header))
        return False
    if not res.is_member:
        await conn.send(ReplicateResponse(status=Status.NOT_JOURNAL_BROKER, header=res.header))
        return False
    if not res.route.equivalent(hdr.route):
        await conn.send(ReplicateResponse(status=Status.WRONG_ROUTE, header=res.header))
        return False
    replica = broker.replica(journal)
    bound = log.bind(journal=journal, route=str(hdr.route), revision=hdr.etcd.revision)
    try:
        await asyncio.wait_for(replica.spool_lock.acquire(), SPOOL_TIMEOUT)
    except asyncio.TimeoutError:
        await conn.send(ReplicateResponse(status=Status.UNAVAILABLE, header=res.header,
                                          message="timed out waiting for the spool"))
        return False
    spool = replica.spool
    try:
        # The route may have moved while we waited for the previous owner.
        now = await broker.resolve(journal, 0)
        if not now.route.equivalent(hdr.route) and now.header.etcd.revision > hdr.etcd.revision:
            await conn.send(ReplicateResponse(status=Status.WRONG_ROUTE, header=now.header))
            return False
        msg: object = first
        payload: bytes | memoryview = b""
        header_sent = False
        while True:
            if isinstance(msg, ReplicateContent):
                spool.apply_content(msg.content_delta, payload)
            elif isinstance(msg, ReplicateProposal):
                resp = spool.apply_proposal(msg)
                if msg.acknowledge:
                    if not header_sent:
                        resp = ReplicateResponse(status=resp.status, header=res.header,
                                                 fragment=resp.fragment, registers=resp.registers)
                        header_sent = True
                    conn.write(resp)
                    await conn.drain()
            else:
                await conn.send_error(f"unexpected {type(msg).__name__} in a replicate stream")
                return False
            try:
                frame = await conn.read()
            except ProtocolError:
                return False  # the primary closed the stream (or died)
            msg, payload = frame.message, frame.payload
    except SpoolError as exc:
        bound.warning("invalid replicate stream; aborting it", error=str(exc))
        await conn.send_error(str(exc), Status.PROPOSAL_MISMATCH)
        return False
    finally:
        spool.rollback()
        replica.spool_lock.release()
