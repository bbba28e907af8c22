"""The Replicate RPC at a replica: a long-lived stream from the journal's primary.

The first proposal carries the primary's header (route + etcd revision). The replica
waits for that revision, checks it is a member (else NOT_JOURNAL_BROKER) and that its
own route is equivalent (else WRONG_ROUTE with its own header, so the primary can tell
who is behind), then takes the spool — blocking while another stream owns it — and
applies every message in order. Only acknowledged proposals are answered. The stream's
end, however it comes, rolls back uncommitted bytes and releases the spool.

Fencing (fence.py): before each proposal the replica checks that its keyspace has not
superseded the stream's route since the header's revision; if it has, it answers
WRONG_ROUTE and ends the stream, so a paused-then-woken primary can no longer commit
here. While it holds the spool the stream is registered on the replica, so a keyspace
change aborts it at once (hosting) and the new primary gets the spool promptly.
"""

from __future__ import annotations


from protocol.logs import get_logger
from protocol import ReplicateContent, ReplicateProposal, ReplicateResponse, Status
from protocol.errors import ProtocolError
from protocol.stream import FrameStream

from .fence import StreamFence
from .pipeline import ACK_OK, ACK_OK_FRAME
from .replica import Replica, acquire_within
from .spool import SpoolError

log = get_logger(__name__)

SPOOL_TIMEOUT = 30.0
_ACK_OK_BUFS = [ACK_OK_FRAME]


def take_spool(replica: Replica) -> None:
    """A replicate stream takes the spool: what it holds that no primary acknowledged
    is not ours to offer to the new primary's sync. That is a former primary's commits
    nobody acknowledged (fence.py, Replica.drop_unacknowledged), and uncommitted
    content: a primary whose pipeline broke after an append's content reached its own
    spool, before the commit, keeps it as the spool's delta (the teardown does not roll
    it back), and a delta made the sync's roll forward to an end within end + delta
    look like a mismatch — the peer seemed behind and the append failed."""
    replica.spool.rollback()
    replica.drop_unacknowledged()


async def _write_failed(replica: Replica, conn: FrameStream, exc: OSError, bound) -> bool:  # noqa: ANN001
    """Our spool could not write: answer the primary with the typed refusal (instead of
    the next acknowledgement, which never leaves) and end the stream; the stream's end
    rolls the uncommitted bytes back."""
    if replica.health is not None:
        status, message = replica.health.write_failed(exc, f"journal {replica.journal}")
    else:
        status, message = Status.SPOOL_FAILED, f"spool write failed: {exc}"
    bound.error("spool write failed: ending the replicate stream", error=repr(exc))
    conn.before_flush = None  # (nothing of ours may wait on the failed file now)
    try:
        await conn.send(ReplicateResponse(status=status, message=message))
    except (OSError, ProtocolError):
        pass
    return False


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
    refusal = replica.health.refusal() if replica.health is not None else None
    if refusal is not None:
        # A full or failed spool takes no new primary's stream: its appends fail before
        # any content leaves, definitely, with our reason (spool_health.py).
        await conn.send(ReplicateResponse(status=refusal[0], header=res.header,
                                          message=refusal[1]))
        return False
    if not await acquire_within(replica.spool_lock, SPOOL_TIMEOUT):
        await conn.send(ReplicateResponse(status=Status.UNAVAILABLE, header=res.header,
                                          message="timed out waiting for the spool"))
        return False
    spool = replica.spool
    resolver = getattr(getattr(broker, "topology", None), "resolver", None)
    fence = StreamFence(resolver, journal, hdr.route, res.header.etcd.revision) \
        if resolver is not None else None
    try:
        # The route may have moved while we waited for the previous owner.
        now = await broker.resolve(journal, 0)
        if not now.route.equivalent(hdr.route) and now.header.etcd.revision > hdr.etcd.revision:
            await conn.send(ReplicateResponse(status=Status.WRONG_ROUTE, header=now.header))
            return False
        take_spool(replica)
        if fence is not None:
            replica.stream = (fence, conn)
        # Our acknowledgements leave only after the bytes they acknowledge reached the
        # spool file (its write-behind: spool_files.py); a failed write sends none.
        conn.before_flush = spool.flush
        msg: object = first
        payload: bytes | memoryview = b""
        header_sent = False
        while True:
            if isinstance(msg, ReplicateContent):
                try:
                    spool.apply_content(msg.content_delta, payload)
                except OSError as exc:
                    return await _write_failed(replica, conn, exc, bound)
            elif isinstance(msg, ReplicateProposal):
                if fence is not None and not fence.valid():
                    # Our keyspace superseded this primary's route: refuse its proposal
                    # (above all a commit) and end the stream (fence.py).
                    now = broker.topology.resolver.resolve_now(journal)
                    bound.warning("replicate stream fenced: route superseded",
                                  current=str(now.route), at=now.header.etcd.revision)
                    await conn.send(ReplicateResponse(status=Status.WRONG_ROUTE, header=now.header))
                    return False
                try:
                    if msg.acknowledge:
                        # The bytes it would commit are on file, or we say why — before
                        # the spool adopts it: a commit never covers bytes not written.
                        spool.flush()
                    resp = spool.apply_proposal(msg, epoch=hdr.etcd.revision)
                except OSError as exc:
                    return await _write_failed(replica, conn, exc, bound)
                if msg.acknowledge:
                    if resp.status == Status.OK:
                        replica.note_synced(spool.end)
                    if not header_sent:
                        resp = ReplicateResponse(status=resp.status, header=res.header,
                                                 fragment=resp.fragment, registers=resp.registers,
                                                 producers=resp.producers, epoch=resp.epoch,
                                                 epoch_begin=resp.epoch_begin,
                                                 epochs=resp.epochs)
                        header_sent = True
                    if resp is ACK_OK:
                        conn.write_encoded(_ACK_OK_BUFS)  # the constant frame, not re-encoded
                    else:
                        conn.write(resp)
                    if not conn.writable():  # (otherwise drain() returns at once: skip the call)
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
        conn.before_flush = None
        if replica.stream is not None and replica.stream[1] is conn:
            replica.stream = None
        try:
            spool.rollback()  # (may raise a failed spool write: the lock goes all the same)
        finally:
            replica.spool_lock.release()
        poke = getattr(getattr(broker, "topology", None), "poke", None)
        if poke is not None:
            poke(replica.journal)  # hosting re-evaluates it (no longer assigned: may retire)
