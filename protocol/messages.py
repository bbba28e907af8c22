"""Every message that crosses a socket, and the wire kind number of each.

A frame carries one message header (msgpack of one of these Structs) plus an optional
raw payload: content chunks travel as the payload of AppendChunk / ReadContent /
ReplicateContent / FragmentContent and are never re-encoded.

RPC shapes (one RPC at a time per connection, after a Hello):

    Append:      AppendRequest, AppendChunk*, (AppendCommit | AppendAbort)  ->  AppendResponse
    Read:        ReadRequest  ->  (ReadResponse, ReadContent*)*  (a stream; ends on a non-OK
                 ReadResponse, end_offset, or when the client closes)
    Replicate:   long-lived stream of (ReplicateProposal | ReplicateContent); only proposals
                 with acknowledge=True are answered, in order, by ReplicateResponse
    List/Apply/ListFragments/ListBrokers/FetchFragment: one request -> one response
                 (FetchFragment is followed by FragmentContent* and a final FragmentContent
                 with an empty payload)
"""

from __future__ import annotations

import msgspec

from .fragment import Fragment
from .labels import LabelSelector, LabelSet
from .producers import ProducerMark, ProducerSnapshot
from .route import Header, ProcessId, Route
from .spec import JournalSpec
from .status import Status

PROTOCOL_VERSION = 1


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of wire messages. `KIND` is the frame kind byte."""

    KIND = 0


# -- connection -------------------------------------------------------------------------

class Hello(Message, frozen=True):
    KIND = 1
    version: int = PROTOCOL_VERSION
    token: str = ""
    """The capability token (protocol/auth.py). Coordinators with keys verify it before
    reading anything else (UNAUTHORIZED + close if bad); without keys it is ignored."""
    mux: bool = False
    """Open a multiplexed replicate connection (protocol/mux.py): after the HelloAck
    every frame travels in a channel's envelope, and each channel opens with its own
    Hello. The token must then carry the REPLICATE capability."""


class HelloAck(Message, frozen=True):
    KIND = 2
    version: int = PROTOCOL_VERSION
    process_id: ProcessId | None = None
    mux: bool = False
    """The answer to a Hello(mux=True): the connection is multiplexed from now on."""


class ErrorFrame(Message, frozen=True):
    """Sent before closing a connection that broke the protocol."""

    KIND = 3
    status: Status = Status.BAD_REQUEST
    message: str = ""


# -- append -----------------------------------------------------------------------------

class AppendRequest(Message, frozen=True):
    KIND = 10
    journal: str
    header: Header | None = None
    """Set when a broker proxies the append (its resolution) — peers wait for its revision."""
    do_not_proxy: bool = False
    offset: int = 0
    """If non-zero, the append must land exactly here (WRONG_APPEND_OFFSET otherwise)."""
    check_registers: LabelSelector | None = None
    union_registers: LabelSet | None = None
    subtract_registers: LabelSet | None = None
    suspend: str = "resume"
    """resume | no-resume | if-flushed | now | keep (Gazette's AppendRequest.Suspend)."""
    min_etcd_revision: int = 0
    # Exactly-once identifiers (protocol/producers.py, docs/exactly-once.md): all zero /
    # empty on a plain append, which then behaves exactly as without them.
    producer: str = ""
    generation: int = 0
    history: int = 0
    txn: int = 0
    close_history: bool = False
    """This transaction closes its history: later ones are refused (HISTORY_CLOSED)."""
    route_revision: int = 0
    """The etcd revision of the header the client's route of the journal came from: an
    OK answer resolved at that same revision omits its header (the route is current),
    sparing both sides a header per append. 0: always send it."""
    roll_below: int = 0
    """If non-zero, the primary first closes (rolls) its open fragment when that fragment
    holds content below this offset, so the content becomes a closed fragment the
    persisters store. The jobs scheduler sends it with a zero-byte append to complete a
    window whose journal's open fragment would otherwise never close (docs/jobs.md)."""


class AppendChunk(Message, frozen=True):
    """A non-empty content chunk; the bytes are the frame payload."""

    KIND = 11


class AppendCommit(Message, frozen=True):
    """The client has sent all content: commit it."""

    KIND = 12


class AppendAbort(Message, frozen=True):
    """The client gives up: roll back everything sent."""

    KIND = 13
    reason: str = ""


class AppendResponse(Message, frozen=True):
    KIND = 14
    status: Status = Status.OK
    header: Header | None = None
    commit: Fragment | None = None
    """The span of just this append (its own SHA-1)."""
    registers: LabelSet | None = None
    total_chunks: int = 0
    delayed_chunks: int = 0
    message: str = ""


# -- read -------------------------------------------------------------------------------

class ReadRequest(Message, frozen=True):
    KIND = 20
    journal: str
    header: Header | None = None
    offset: int = 0
    """-1 reads from the write head."""
    block: bool = False
    do_not_proxy: bool = False
    metadata_only: bool = False
    end_offset: int = 0
    """0 = no end; otherwise stop before this offset."""
    begin_mod_time: int = 0
    min_etcd_revision: int = 0
    held_only: bool = False
    """A member filling a gap of its own asks its peers with this (and `do_not_proxy`):
    serve only what you hold (spool, local fragments, store); at the first offset you do
    not hold, answer OFFSET_NOT_YET_AVAILABLE instead of skipping ahead or asking on."""
    lineage: tuple[tuple[int, int], ...] = ()
    """With held_only, asked of a former member: the asker's epoch history ((epoch,
    begin) pairs). Serve only what you hold on local disk whose epoch here is the asker's
    at the same offset: bytes of one lineage, never a tail a later epoch replaced."""


class ReadResponse(Message, frozen=True):
    """Metadata of the fragment about to be streamed (or a non-OK status)."""

    KIND = 21
    status: Status = Status.OK
    header: Header | None = None
    offset: int = 0
    write_head: int = 0
    fragment: Fragment | None = None
    fragment_url: str = ""
    message: str = ""


class ReadContent(Message, frozen=True):
    """Content at `offset`; the bytes are the frame payload."""

    KIND = 22
    offset: int = 0


# -- replicate --------------------------------------------------------------------------

class ReplicateProposal(Message, frozen=True):
    KIND = 30
    proposal: Fragment
    registers: LabelSet = LabelSet()
    acknowledge: bool = True
    header: Header | None = None
    """Required on the first message of a stream (route + revision of the primary)."""
    mark: ProducerMark | None = None
    """An identified append's transaction: recorded in the producer table once this
    proposal is adopted (a commit, or the barrier of a history close)."""
    producers: ProducerSnapshot | None = None
    """The primary's whole producer table, on synchronizing proposals: adopted by a
    replica that this proposal rolls forward."""
    epoch: int = 0
    """On a synchronizing roll: the epoch (etcd revision of the route it was committed
    under) of the content that ends at the proposal's offset."""
    epoch_begin: int = 0
    """With `epoch`: the offset at which that epoch's content begins. A replica holding
    content of an older epoch past it holds a tail no later route acknowledged: it cuts
    its spool back to `epoch_begin` before rolling (spool.py, "stale tails")."""
    epochs: tuple[tuple[int, int], ...] = ()
    """With `epoch`: the proposer's epoch history, (epoch, begin offset) of each epoch
    its content is of, oldest first, ending with (`epoch`, `epoch_begin`). A replica
    whose last commit is of epoch e cuts at the begin of the first epoch after e in it
    (Kafka's KIP-279: `epoch_begin` alone misses epochs between e and `epoch`)."""


class ReplicateContent(Message, frozen=True):
    """A content chunk; `content_delta` = its offset from the committed end."""

    KIND = 31
    content_delta: int = 0


class ReplicateResponse(Message, frozen=True):
    KIND = 32
    status: Status = Status.OK
    header: Header | None = None
    fragment: Fragment | None = None
    """On PROPOSAL_MISMATCH: the replica's own fragment."""
    registers: LabelSet | None = None
    message: str = ""
    producers: ProducerSnapshot | None = None
    """On PROPOSAL_MISMATCH: the replica's producer table (taken with its registers by a
    primary that rolls forward to it)."""
    epoch: int = 0
    """On PROPOSAL_MISMATCH: the epoch of the replica's last commit (0: unknown)."""
    epoch_begin: int = 0
    """On PROPOSAL_MISMATCH: the offset at which the replica's content of `epoch` begins."""
    epochs: tuple[tuple[int, int], ...] = ()
    """On PROPOSAL_MISMATCH: the replica's epoch history (ReplicateProposal.epochs)."""


class ChannelClose(Message, frozen=True):
    """Ends one channel of a multiplexed replicate connection (protocol/mux.py), either
    way: the primary closing its stream, or the replica ending it (after its answer)."""

    KIND = 33
    reason: str = ""


# -- topology & metadata ----------------------------------------------------------------

class ListRequest(Message, frozen=True):
    KIND = 40
    selector: LabelSelector = LabelSelector()
    page_limit: int = 0
    """Entries per response at most (0: every entry in one response, which fails past
    ~1,800 journals: a response is one frame of at most 1 MiB of header). A paged
    response also stops short of half that many bytes."""
    page_token: str = ""
    """List only journals named after this one: the previous page's next_page_token."""


class ListEntry(msgspec.Struct, frozen=True, kw_only=True):
    spec: JournalSpec
    mod_revision: int = 0
    create_revision: int = 0
    route: Route = Route()


class ListResponse(Message, frozen=True):
    KIND = 41
    status: Status = Status.OK
    header: Header | None = None
    journals: tuple[ListEntry, ...] = ()
    message: str = ""
    next_page_token: str = ""
    """Set when more entries follow: ask again with it as page_token. Each page is read
    at its own etcd revision (as Gazette's paged List)."""


class ApplyChange(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    expect_mod_revision: int = 0
    """0 = must not exist; > 0 = must be at this revision; -1 = no check."""
    upsert: JournalSpec | None = None
    delete: str = ""


class ApplyRequest(Message, frozen=True):
    KIND = 42
    changes: tuple[ApplyChange, ...] = ()


class ApplyResponse(Message, frozen=True):
    KIND = 43
    status: Status = Status.OK
    header: Header | None = None
    revision: int = 0
    message: str = ""


class ListFragmentsRequest(Message, frozen=True):
    KIND = 44
    journal: str
    begin_mod_time: int = 0
    end_mod_time: int = 0
    next_page_token: int = 0
    page_limit: int = 1000
    signature_ttl: float = 60.0
    do_not_proxy: bool = False


class FragmentInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    spec: Fragment
    signed_url: str = ""
    local: bool = False
    """True while the fragment is (also) on a replica's disk."""


class ListFragmentsResponse(Message, frozen=True):
    KIND = 45
    status: Status = Status.OK
    header: Header | None = None
    fragments: tuple[FragmentInfo, ...] = ()
    next_page_token: int = 0
    message: str = ""


class BrokerInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: ProcessId
    endpoint: str
    journal_limit: int = 0
    assigned: int = 0
    primaries: int = 0
    exiting: bool = False
    health: str = ""
    """Empty while healthy; else why its spool refuses writes (full / failed: reason)."""


class ListBrokersRequest(Message, frozen=True):
    KIND = 46


class ListBrokersResponse(Message, frozen=True):
    KIND = 47
    status: Status = Status.OK
    header: Header | None = None
    brokers: tuple[BrokerInfo, ...] = ()
    message: str = ""


class FetchFragmentRequest(Message, frozen=True):
    """Fetch the raw bytes of a closed local fragment (used by the persist workers)."""

    KIND = 48
    fragment: Fragment


class FetchFragmentResponse(Message, frozen=True):
    KIND = 49
    status: Status = Status.OK
    message: str = ""


class FragmentContent(Message, frozen=True):
    """Raw fragment bytes as payload; an empty payload ends the stream."""

    KIND = 50


ALL_MESSAGES: tuple[type[Message], ...] = tuple(
    cls for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, Message) and cls is not Message
)
