"""etcd's own limits, named: a transaction over `--max-txn-ops` or `--max-request-bytes`
is refused as INVALID_ARGUMENT (or, far over, RESOURCE_EXHAUSTED by gRPC). That is not
an unavailable cluster: `limit_error` turns it into ETCD_LIMIT_EXCEEDED naming the limit,
the request's size and the flag that makes smaller transactions."""

from __future__ import annotations

from typing import Any

import grpc
from aetcd import rpc

from protocol.errors import EtcdLimitExceeded

__all__ = ["FLAG_HINT", "limit_error"]

SMALLEST_REFUSED = 512 << 10
"""etcd's gRPC server accepts --max-request-bytes plus 512 KiB: smaller requests are
never refused by gRPC itself."""

FLAG_HINT = ("apply in smaller transactions: --max-txn-size N on `quire journals|shards|jobs "
             "apply`, max_txn_size= in the client library")


def limit_error(exc: BaseException, request: Any) -> EtcdLimitExceeded | None:
    """EtcdLimitExceeded when etcd (or its gRPC server) refused `request` for one of its
    limits, naming the limit, the request's size and the flag that works around it;
    None for any other failure. Never UNAVAILABLE: the cluster is fine, the request is
    too big for it."""
    if not isinstance(exc, rpc.AioRpcError):
        return None
    details = (exc.details() or "").lower()
    code = exc.code()
    ops = max(len(request.compare), len(request.success), len(request.failure))
    if code == grpc.StatusCode.INVALID_ARGUMENT and "too many operations" in details:
        return EtcdLimitExceeded(
            f"etcd refused a transaction of {ops} operations: too many operations in one "
            f"transaction (etcd's --max-txn-ops, 128 by default); {FLAG_HINT}")
    size = request.ByteSize()
    # gRPC's own RESOURCE_EXHAUSTED also answers a *response* over the client's receive
    # limit: only a request of a size etcd could refuse is blamed on the request.
    if (code == grpc.StatusCode.INVALID_ARGUMENT and "request is too large" in details) or (
            code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details
            and size >= SMALLEST_REFUSED):
        return EtcdLimitExceeded(
            f"etcd refused a transaction of {size} bytes ({ops} operations): request too large "
            f"(etcd's --max-request-bytes, 1.5 MiB by default); {FLAG_HINT}")
    return None
