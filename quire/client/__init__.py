"""quire's client library (layer 3): imports only protocol and fragment_store.

    Client            asyncio client: append, read, list/apply/delete, fragments, brokers
    SyncClient        the same, blocking, on a private event loop thread
    AppendService     batched, ordered, spilling appends of many small messages
    Reader            async iterator of (offset, bytes) returned by Client.read
    messages          JSON-lines framing (LineFramer) and key -> journal Mapper
"""

from protocol.errors import CommitUnknown, QuireError, StatusError, Unavailable

from .append_service import AppendService, ServiceClosed
from .client import Client
from .producer import History, Producer, TxnId
from .messages import FramingError, LineFramer, Mapper, NoJournals, encode, read_messages, rendezvous
from .reader import Reader
from .results import AppendResult
from .store_reader import StoreReadError
from .sync import SyncClient

__all__ = [
    "AppendResult",
    "AppendService",
    "Client",
    "CommitUnknown",
    "FramingError",
    "History",
    "Producer",
    "TxnId",
    "LineFramer",
    "Mapper",
    "NoJournals",
    "QuireError",
    "Reader",
    "ServiceClosed",
    "StatusError",
    "StoreReadError",
    "SyncClient",
    "Unavailable",
    "encode",
    "read_messages",
    "rendezvous",
]
