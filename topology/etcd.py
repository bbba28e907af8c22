"""etcd plumbing for the topology: connecting, the key layout, transactions, errors.

Key layout (docs/architecture.md, followed exactly):

    <root>/journals/<journal>                      JournalSpec JSON, no lease
    <root>/members/<zone>#<suffix>                 BrokerSpec JSON, member's lease
    <root>/assign/<journal>#<zone>#<suffix>#<slot> Route JSON ({} until advertised), assignee's lease
    <root>/allocator/leader                        "<zone>#<suffix>", leader's lease

Journal names, zones and suffixes never contain '#' (their alphabets exclude it), so an
assignment key splits unambiguously from the right.

Transactions are built from raw protobuf requests instead of aetcd's `transaction()`
because we need the response header revision (aetcd drops it), which is what callers
wait for in their KeySpace to read their own writes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aetcd
import grpc
from aetcd import rpc

from protocol import ProcessId
from protocol.errors import EtcdLimitExceeded, EtcdTransactionFailed, QuireError, Unavailable  # noqa: F401
from protocol.status import Status

from .etcd_client import EtcdClient, EtcdEndpointError, EtcdTLS, parse_endpoints
from .etcd_limits import limit_error

__all__ = [
    "AssignmentConflict",
    "DuplicateMember",
    "EtcdError",
    "EtcdLimitExceeded",
    "EtcdRefused",
    "check_access",
    "MalformedKey",
    "NotLeader",
    "TopologyError",
    "TxnResult",
    "assign_prefix",
    "assignment_key",
    "cmp_create",
    "cmp_mod",
    "cmp_value",
    "cmp_version",
    "client_for",
    "connect",
    "describe_etcd_error",
    "limit_error",
    "delete_op",
    "journal_key",
    "journals_prefix",
    "leader_key",
    "member_key",
    "members_prefix",
    "parse_assignment_key",
    "parse_journal_key",
    "parse_member_key",
    "prefix_end",
    "put_op",
    "range_op",
    "txn",
]


# -- errors -------------------------------------------------------------------------------

class TopologyError(QuireError):
    """Base of the topology layer's own errors."""


class DuplicateMember(TopologyError):
    """A member key for this ProcessId already exists (another live process holds it)."""


class NotLeader(TopologyError):
    """The allocator lost (or never had) the leader key."""


class MalformedKey(TopologyError, ValueError):
    """A key under the root does not follow the layout."""


class AssignmentConflict(EtcdTransactionFailed):
    """Assignments changed between the read and the guarded write (a stale route)."""


class EtcdError(Unavailable):
    """etcd could not be reached or refused a request (retriable: UNAVAILABLE)."""


class EtcdRefused(EtcdError):
    """etcd refused this client: no or a wrong client certificate (TLS handshake), plain
    HTTP to a TLS port, or a user whose role lacks the key (PERMISSION_DENIED). Not
    retriable: the message names etcd and the reason."""

    status = Status.UNAUTHORIZED


# -- connecting ---------------------------------------------------------------------------

def client_for(url: str, *, timeout: float | None = 10.0,
               tls: EtcdTLS | None = None) -> EtcdClient:
    """An unconnected client for `url`: one or several comma-separated endpoints
    (`http://a:2379,http://b:2379`; `https://` with `tls`, or with QUIRE_ETCD_CA,
    QUIRE_ETCD_CERT and QUIRE_ETCD_KEY in the environment when `tls` is None)."""
    try:
        endpoints = parse_endpoints(url)
        return EtcdClient(endpoints, tls=tls if tls is not None else EtcdTLS.from_env(),
                          timeout=timeout)
    except EtcdEndpointError as exc:
        raise TopologyError(f"etcd: {exc} (set by QUIRE_ETCD_URL or --etcd)") from None


async def connect(url: str, *, timeout: float | None = 10.0, tls: EtcdTLS | None = None,
                  probe: float | None = None, root: str | None = None) -> EtcdClient:
    """A connected client for `url` (see `client_for`).

    The per-call timeout bounds every unary RPC, so a dead etcd surfaces as an error
    instead of a hang; watches are long-lived streams and are not bounded by it.
    With `probe` (seconds), one member must answer a status request within it, else
    `EtcdError` names etcd, the URLs tried and the variable that sets them: what a
    command-line tool wants, failing fast. Long-lived roles connect without a probe and
    ride out an etcd that is not up yet with their own retries.
    """
    client = client_for(url, timeout=timeout, tls=tls)
    try:
        await client.connect()
        if probe is not None:
            await _probe(client, probe)
            if root is not None:
                await check_access(client, root, probe)
    except BaseException as exc:
        await client.close()
        if isinstance(exc, EtcdError | asyncio.CancelledError):
            raise
        raise EtcdError(f"etcd unreachable at {client.url} (set by QUIRE_ETCD_URL or --etcd): "
                        f"{describe_etcd_error(exc)}") from exc
    return client


async def check_access(client: EtcdClient, root: str, timeout: float = 10.0) -> None:
    """Read one key under `root` (count only): EtcdRefused when the client's etcd user
    (its certificate's CN) has no role granting the cluster's prefix."""
    prefix = _root(root).encode() + b"/"
    try:
        await client.kvstub.Range(rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix),
                                                   count_only=True),
                                  timeout=timeout, metadata=client.metadata)
    except rpc.AioRpcError as exc:
        raise EtcdRefused(f"etcd at {client.url} refused {_user(client)} on "
                          f"{prefix.decode()}: {describe_etcd_error(exc)}") from None


def _user(client: EtcdClient) -> str:
    """`user 'quire'` (the CN of the client certificate) or `a client without a certificate`."""
    tls = client.tls
    if tls is None or not tls.cert:
        return "a client without a certificate"
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        with open(tls.cert, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return f"user {cn[0].value!r}" if cn else f"the certificate {tls.cert}"
    except Exception:  # noqa: BLE001 - only for the message
        return f"the certificate {tls.cert}"


def refusal_reason(details: str) -> str | None:
    """Why a failed gRPC connection was refused, if it was (not merely down)."""
    low = details.lower()
    if "tsi_data_corrupted" in low or "bad_certificate" in low or "handshake failed" in low \
            or "certificate required" in low or "unwrap failed" in low:
        return ("TLS handshake refused: etcd requires a client certificate signed by its CA "
                "(QUIRE_ETCD_CERT, QUIRE_ETCD_KEY)")
    if "security handshaker" in low or "certificate verify failed" in low:
        return "TLS handshake failed: the server's certificate does not chain to QUIRE_ETCD_CA"
    if "socket closed" in low:
        return ("the member closed the connection at once: it serves TLS? "
                "(use https:// with QUIRE_ETCD_CA and a client certificate)")
    return None


async def _probe(client: EtcdClient, seconds: float) -> None:
    """Ask the members, each in turn, for their status until one answers."""
    deadline = asyncio.get_running_loop().time() + seconds
    last: BaseException | None = None
    for _ in client.endpoints:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            break
        channel = client.channel
        try:
            await client.maintenancestub.Status(rpc.StatusRequest(), timeout=left,
                                                metadata=client.metadata)
            return
        except rpc.AioRpcError as exc:
            last = exc
            client.fail_over(f"probe: {exc.code().name}", channel=channel)
            await client.connect()
    if isinstance(last, rpc.AioRpcError) and refusal_reason(last.details() or ""):
        raise EtcdRefused(f"etcd at {client.url} refused {_user(client)}: "
                          f"{refusal_reason(last.details() or '')}")
    raise EtcdError(f"etcd unreachable at {client.url} (set by QUIRE_ETCD_URL or --etcd): "
                    f"{describe_etcd_error(last) if last else f'no answer within {seconds:g} s'}")


def describe_etcd_error(exc: BaseException) -> str:
    """One line for a gRPC failure, without gRPC's debug string."""
    if isinstance(exc, rpc.AioRpcError):
        code = exc.code()
        details = (exc.details() or "").split(";")[0].strip()
        if code == grpc.StatusCode.UNAVAILABLE:
            reason = refusal_reason(exc.details() or "")
            if reason is not None:
                return f"refused: {reason}"
            return f"no member answered ({details or 'connection refused'})"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "no answer in time"
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return (f"refused: {details} (the etcd user, the CN of QUIRE_ETCD_CERT, has no "
                    "role granting this key)")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return f"refused: {details} (no etcd user: present a client certificate)"
        return f"{code.name}: {details}"
    return f"{type(exc).__name__}: {exc}"


# -- keys ---------------------------------------------------------------------------------

def _root(root: str) -> str:
    return root.rstrip("/")


def journals_prefix(root: str) -> str:
    return f"{_root(root)}/journals/"


def members_prefix(root: str) -> str:
    return f"{_root(root)}/members/"


def assign_prefix(root: str) -> str:
    return f"{_root(root)}/assign/"


def leader_key(root: str) -> str:
    return f"{_root(root)}/allocator/leader"


def journal_key(root: str, name: str) -> str:
    return journals_prefix(root) + name


def member_key(root: str, pid: ProcessId) -> str:
    return members_prefix(root) + str(pid)


def assignment_key(root: str, journal: str, pid: ProcessId, slot: int) -> str:
    return f"{assign_prefix(root)}{journal}#{pid.zone}#{pid.suffix}#{slot}"


def parse_journal_key(root: str, key: str) -> str:
    prefix = journals_prefix(root)
    if not key.startswith(prefix) or len(key) == len(prefix):
        raise MalformedKey(f"{key!r} is not a journal key under {root!r}")
    return key[len(prefix):]


def parse_member_key(root: str, key: str) -> ProcessId:
    prefix = members_prefix(root)
    if not key.startswith(prefix):
        raise MalformedKey(f"{key!r} is not a member key under {root!r}")
    try:
        return ProcessId.parse(key[len(prefix):])
    except ValueError as exc:
        raise MalformedKey(f"{key!r}: {exc}") from exc


def parse_assignment_key(root: str, key: str) -> tuple[str, ProcessId, int]:
    """(journal, member, slot) of `<root>/assign/<journal>#<zone>#<suffix>#<slot>`."""
    prefix = assign_prefix(root)
    if not key.startswith(prefix):
        raise MalformedKey(f"{key!r} is not an assignment key under {root!r}")
    parts = key[len(prefix):].rsplit("#", 3)
    if len(parts) != 4 or not parts[0]:
        raise MalformedKey(f"{key!r}: expected <journal>#<zone>#<suffix>#<slot>")
    journal, zone, suffix, slot_text = parts
    if not slot_text.isdigit():
        raise MalformedKey(f"{key!r}: slot {slot_text!r} is not a non-negative integer")
    try:
        pid = ProcessId(zone, suffix)
        pid.validate()
    except ValueError as exc:
        raise MalformedKey(f"{key!r}: {exc}") from exc
    return journal, pid, int(slot_text)


def prefix_end(prefix: bytes) -> bytes:
    """The range end selecting every key that starts with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


# -- transactions -------------------------------------------------------------------------

def _b(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def cmp_mod(key: str | bytes, revision: int) -> Any:
    """ModRevision(key) == revision (0 also matches an absent key)."""
    return rpc.Compare(key=_b(key), target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                       mod_revision=revision)


def cmp_create(key: str | bytes, revision: int) -> Any:
    return rpc.Compare(key=_b(key), target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                       create_revision=revision)


def cmp_version(key: str | bytes, version: int) -> Any:
    """Version(key) == version; version 0 means the key must not exist."""
    return rpc.Compare(key=_b(key), target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL,
                       version=version)


def cmp_value(key: str | bytes, value: bytes) -> Any:
    return rpc.Compare(key=_b(key), target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL,
                       value=value)


def put_op(key: str | bytes, value: bytes, lease: int = 0) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=_b(key), value=value, lease=lease))


def delete_op(key: str | bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=_b(key)))


def range_op(key: str | bytes, *, prefix: bool = False) -> Any:
    k = _b(key)
    req = rpc.RangeRequest(key=k, range_end=prefix_end(k)) if prefix else rpc.RangeRequest(key=k)
    return rpc.RequestOp(request_range=req)


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    """The etcd revision after the transaction (or at which its compare failed)."""
    responses: tuple[Any, ...]
    """Raw ResponseOps of the branch that ran."""


async def txn(client: aetcd.Client, compare: list[Any], success: list[Any],
              failure: list[Any] | None = None) -> TxnResult:
    """Run one etcd transaction; gRPC failures become EtcdError."""
    await client.connect()
    request = rpc.TxnRequest(compare=compare, success=success, failure=failure or [])
    channel = client.channel
    try:
        resp = await client.kvstub.Txn(request, timeout=client._timeout,  # noqa: SLF001
                                       metadata=client.metadata)
    except rpc.AioRpcError as exc:
        limit = limit_error(exc, request)
        if limit is not None:
            raise limit from exc
        if isinstance(client, EtcdClient):
            client.note(exc, channel)
        raise EtcdError(f"etcd txn failed: {describe_etcd_error(exc)}") from exc
    return TxnResult(bool(resp.succeeded), int(resp.header.revision), tuple(resp.responses))
