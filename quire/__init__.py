"""quire: the client library of a Gazette-style journal broker (layer 3).

What a user imports: ``from quire import Client``. It may import ``protocol/`` (layer 1)
and ``fragment_store/`` (layer 2), never a role or a tool.

    quire.client   Client, SyncClient, AppendService, Reader, message framing
"""

from quire.client import AppendService, Client, SyncClient

__version__ = "0.1.0"

__all__ = ["AppendService", "Client", "SyncClient", "__version__"]
