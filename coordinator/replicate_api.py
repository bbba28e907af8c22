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

The stream's set-up (`open_session`) is asynchronous; once it holds the spool, every
frame is applied synchronously (`ReplicateSession.on_frame`), so the same session
serves a stream over its own connection (`serve_replicate`) and a channel of a
multiplexed connection, dispatched from that connection's reader (replicate_mux.py).
Compiled with mypyc (protocol/native.py, docs/compiled.md): one name per `except`
clause, and what it reads of a Replica is annotated there.
"""

from __future__ import annotations

import asyncio

from protocol.logs import get_logger
from protocol import ErrorFrame, ReplicateContent, ReplicateProposal, ReplicateResponse, Status
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


class ReplicateSession:
    """One replicate stream at the replica once set up (it holds the spool): every
    frame is applied synchronously by `on_frame`, which writes the acknowledgements to
    `out` (a FrameStream, or a channel of a multiplexed connection: replicate_mux.py)
    and says whether the stream goes on. `finish` is the stream's end, however it
    comes: uncommitted bytes roll back and the spool is released."""

    __slots__ = ("broker", "replica", "spool", "out", "hdr", "res_header", "fence",
                 "bound", "header_sent", "unhook", "finished")

    def __init__(self, broker, replica: Replica, out, hdr, res_header, fence,  # noqa: ANN001
                 bound, unhook) -> None:  # noqa: ANN001
        self.broker = broker
        self.replica = replica
        self.spool = replica.spool
        self.out = out
        self.hdr = hdr
        self.res_header = res_header
        self.fence = fence
        self.bound = bound
        self.header_sent = False
        self.unhook = unhook
        """Called before a spool write failure's answer: nothing queued that waits on
        the failed file may leave (the acknowledgements it would have covered)."""
        self.finished = False

    def on_frame(self, msg: object, payload: bytes | memoryview) -> bool:
        """Apply one frame; False: the stream ends (its last answer already written)."""
        spool, out = self.spool, self.out
        try:
            if isinstance(msg, ReplicateContent):
                try:
                    spool.apply_content(msg.content_delta, payload)
                except OSError as content_failed:
                    return self._write_failed(content_failed)
                return True
            if not isinstance(msg, ReplicateProposal):
                out.write(ErrorFrame(status=Status.BAD_REQUEST,
                                     message=f"unexpected {type(msg).__name__} in a replicate stream"))
                return False
            fence = self.fence
            if fence is not None and not fence.valid():
                # Our keyspace superseded this primary's route: refuse its proposal
                # (above all a commit) and end the stream (fence.py).
                now = self.broker.topology.resolver.resolve_now(self.replica.journal)
                self.bound.warning("replicate stream fenced: route superseded",
                                   current=str(now.route), at=now.header.etcd.revision)
                out.write(ReplicateResponse(status=Status.WRONG_ROUTE, header=now.header))
                return False
            try:
                if msg.acknowledge:
                    # The bytes it would commit are on file, or we say why — before
                    # the spool adopts it: a commit never covers bytes not written.
                    spool.flush()
                resp = spool.apply_proposal(msg, epoch=self.hdr.etcd.revision)
            except OSError as proposal_failed:
                return self._write_failed(proposal_failed)
            if msg.acknowledge:
                if resp.status == Status.OK:
                    self.replica.note_synced(spool.end)
                if not self.header_sent:
                    resp = ReplicateResponse(status=resp.status, header=self.res_header,
                                             fragment=resp.fragment, registers=resp.registers,
                                             producers=resp.producers, epoch=resp.epoch,
                                             epoch_begin=resp.epoch_begin,
                                             epochs=resp.epochs)
                    self.header_sent = True
                if resp is ACK_OK:
                    out.write_encoded(_ACK_OK_BUFS)  # the constant frame, not re-encoded
                else:
                    out.write(resp)
            return True
        except SpoolError as exc:
            self.bound.warning("invalid replicate stream; aborting it", error=str(exc))
            out.write(ErrorFrame(status=Status.PROPOSAL_MISMATCH, message=str(exc)[:1000]))
            return False

    def _write_failed(self, exc: OSError) -> bool:
        """Our spool could not write: answer the primary with the typed refusal (instead
        of the next acknowledgement, which never leaves) and end the stream; its end
        rolls the uncommitted bytes back."""
        replica = self.replica
        if replica.health is not None:
            status, message = replica.health.write_failed(exc, f"journal {replica.journal}")
        else:
            status, message = Status.SPOOL_FAILED, f"spool write failed: {exc}"
        self.bound.error("spool write failed: ending the replicate stream", error=repr(exc))
        self.unhook()  # (nothing of ours may wait on the failed file now)
        self.out.write(ReplicateResponse(status=status, message=message))
        return False

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        replica = self.replica
        if replica.stream is not None and replica.stream[1] is self.out:
            replica.stream = None
        try:
            self.spool.rollback()  # (may raise a failed spool write: the lock goes all the same)
        finally:
            replica.spool_lock.release()
            poke = getattr(getattr(self.broker, "topology", None), "poke", None)
            if poke is not None:
                poke(replica.journal)  # hosting re-evaluates it (no longer assigned: may retire)


async def open_session(broker, out, first: ReplicateProposal, unhook) -> ReplicateSession | None:  # noqa: ANN001
    """Set a replicate stream up at this replica: None if refused (the refusal is
    written to `out` and sent); else a session holding the spool. `out.send` flushes."""
    hdr = first.header
    journal = first.proposal.journal
    if hdr is None:
        await out.send(ErrorFrame(status=Status.BAD_REQUEST,
                                  message="the first replicate message must carry a header"))
        return None
    res = await broker.resolve(journal, hdr.etcd.revision)
    if res.status != Status.OK:
        await out.send(ReplicateResponse(status=res.status, header=res.header))
        return None
    if not res.is_member:
        await out.send(ReplicateResponse(status=Status.NOT_JOURNAL_BROKER, header=res.header))
        return None
    if not res.route.equivalent(hdr.route):
        await out.send(ReplicateResponse(status=Status.WRONG_ROUTE, header=res.header))
        return None
    replica = broker.replica(journal)
    bound = log.bind(journal=journal, route=str(hdr.route), revision=hdr.etcd.revision)
    refusal = replica.health.refusal() if replica.health is not None else None
    if refusal is not None:
        # A full or failed spool takes no new primary's stream: its appends fail before
        # any content leaves, definitely, with our reason (spool_health.py).
        await out.send(ReplicateResponse(status=refusal[0], header=res.header,
                                         message=refusal[1]))
        return None
    if not await acquire_within(replica.spool_lock, SPOOL_TIMEOUT):
        await out.send(ReplicateResponse(status=Status.UNAVAILABLE, header=res.header,
                                         message="timed out waiting for the spool"))
        return None
    resolver = getattr(getattr(broker, "topology", None), "resolver", None)
    fence = StreamFence(resolver, journal, hdr.route, res.header.etcd.revision) \
        if resolver is not None else None
    session = ReplicateSession(broker, replica, out, hdr, res.header, fence, bound, unhook)
    try:
        # The route may have moved while we waited for the previous owner.
        now = await broker.resolve(journal, 0)
        if not now.route.equivalent(hdr.route) and now.header.etcd.revision > hdr.etcd.revision:
            await out.send(ReplicateResponse(status=Status.WRONG_ROUTE, header=now.header))
            session.finish()
            return None
        take_spool(replica)
    except BaseException:
        session.finish()
        raise
    if fence is not None:
        replica.stream = (fence, out)
    return session


async def serve_replicate(broker, conn: FrameStream, first: ReplicateProposal) -> bool:  # noqa: ANN001
    """Serve a replicate stream over its own connection until the primary closes it.
    Never reuses the connection."""
    def unhook() -> None:
        conn.before_flush = None

    session = await open_session(broker, conn, first, unhook)
    if session is None:
        return False
    try:
        # Our acknowledgements leave only after the bytes they acknowledge reached the
        # spool file (its write-behind: spool_files.py); a failed write sends none.
        conn.before_flush = session.spool.flush
        msg: object = first
        payload: bytes | memoryview = b""
        while session.on_frame(msg, payload):
            if not conn.writable():  # (otherwise drain() returns at once: skip the call)
                await conn.drain()
            try:
                frame = await conn.read()
            except ProtocolError:
                return False  # the primary closed the stream (or died)
            msg, payload = frame.message, frame.payload
        try:  # the stream's last answer leaves before the connection closes
            conn.flush()
            async with asyncio.timeout(1.0):
                await conn.drain()
        except (ProtocolError, OSError, asyncio.TimeoutError):
            pass
        return False
    finally:
        conn.before_flush = None
        session.finish()
