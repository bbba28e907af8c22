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

import urllib.parse
from dataclasses import dataclass
from typing import Any

import aetcd
from aetcd import rpc

from protocol import ProcessId
from protocol.errors import EtcdTransactionFailed, QuireError, Unavailable

__all__ = [
    "AssignmentConflict",
    "DuplicateMember",
    "EtcdError",
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
    "connect",
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


# -- connecting ---------------------------------------------------------------------------

async def connect(url: str, *, timeout: float | None = 10.0) -> aetcd.Client:
    """A connected aetcd client for `http://host:port` (or bare `host:port`).

    The per-call timeout bounds every unary RPC, so a dead etcd surfaces as an error
    instead of a hang; watches are long-lived streams and are not bounded by it.
    """
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", ""):
        raise TopologyError(f"etcd url {url!r}: only plain http:// is supported")
    client = aetcd.Client(host=parsed.hostname or "127.0.0.1", port=parsed.port or 2379,
                          timeout=timeout)
    try:
        await client.connect()
    except Exception as exc:  # noqa: BLE001 - map to our typed error
        raise EtcdError(f"cannot connect to etcd at {url}: {exc}") from exc
    return client


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
    try:
        resp = await client.kvstub.Txn(request, timeout=client._timeout,  # noqa: SLF001
                                       metadata=client.metadata)
    except rpc.AioRpcError as exc:
        raise EtcdError(f"etcd txn failed: {exc.code().name}: {exc.details()}") from exc
    return TxnResult(bool(resp.succeeded), int(resp.header.revision), tuple(resp.responses))
