"""What every `quire` command shares: the broker address, output formats, exit codes.

Exit codes (one per class of failure, so scripts can branch on them):

    0   success
    1   unexpected error (a bug: please report it)
    2   usage error (bad flag or argument; printed by click)
    3   not found (JOURNAL_NOT_FOUND, SHARD_NOT_FOUND, a missing file)
    4   conflict: a precondition did not hold (ETCD_TRANSACTION_FAILED,
        WRONG_APPEND_OFFSET, REGISTER_MISMATCH, INDEX_HAS_GREATER_OFFSET, PROPOSAL_MISMATCH)
    5   not allowed (NOT_ALLOWED, SUSPENDED, UNAUTHORIZED, FORBIDDEN)
    6   unavailable: the cluster could not serve the request (UNAVAILABLE, no primary,
        insufficient brokers, wrong route, store unhealthy, connection refused)
    7   invalid input (validation errors, BAD_REQUEST, malformed spec files, config,
        ETCD_LIMIT_EXCEEDED: a transaction over etcd's limits; see --max-txn-size)
    8   protocol error (the peer is not a quire broker, or a version mismatch)
    9   outcome unknown (COMMIT_UNKNOWN): an append's commit was sent and then the answer
        was lost; it may or may not be in the journal, so a blind retry may duplicate it
    130 interrupted (Ctrl-C)

An apply stopped part-way (ApplyIncomplete) exits with the code of what stopped it.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import msgspec
import typer
import yaml

from quire.client import Client
from protocol import Status
from protocol.config import Settings
from protocol.apply_chunks import ApplyIncomplete
from protocol.tls import TLSRefused
from protocol.errors import (
    ProtocolError,
    QuireError,
    StatusError,
    Unavailable,
    ValidationError,
    connection_reason,
)
from tools.output import make_console, make_table

T = TypeVar("T")

DEFAULT_BROKER = "127.0.0.1:8080"

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_NOT_ALLOWED = 3, 4, 5
EXIT_UNAVAILABLE, EXIT_INVALID, EXIT_PROTOCOL, EXIT_INTERRUPTED = 6, 7, 8, 130
EXIT_OUTCOME_UNKNOWN = 9
EXIT_CORRUPT = 10

_STATUS_EXIT = {
    Status.JOURNAL_NOT_FOUND: EXIT_NOT_FOUND,
    Status.ETCD_TRANSACTION_FAILED: EXIT_CONFLICT,
    Status.WRONG_APPEND_OFFSET: EXIT_CONFLICT,
    Status.REGISTER_MISMATCH: EXIT_CONFLICT,
    Status.INDEX_HAS_GREATER_OFFSET: EXIT_CONFLICT,
    Status.PROPOSAL_MISMATCH: EXIT_CONFLICT,
    Status.NOT_ALLOWED: EXIT_NOT_ALLOWED,
    Status.SUSPENDED: EXIT_NOT_ALLOWED,
    Status.BAD_REQUEST: EXIT_INVALID,
    Status.OFFSET_NOT_YET_AVAILABLE: EXIT_NOT_FOUND,
    Status.COMMIT_UNKNOWN: EXIT_OUTCOME_UNKNOWN,
    Status.UNAUTHORIZED: EXIT_NOT_ALLOWED,
    Status.FORBIDDEN: EXIT_NOT_ALLOWED,
    Status.SHARD_NOT_FOUND: EXIT_NOT_FOUND,
    Status.SHARD_FENCED: EXIT_CONFLICT,
    Status.SPOOL_FULL: EXIT_UNAVAILABLE,
    Status.SPOOL_FAILED: EXIT_UNAVAILABLE,
    Status.ETCD_LIMIT_EXCEEDED: EXIT_INVALID,
    Status.FRAGMENT_CORRUPT: EXIT_CORRUPT,
}


class Output(str, enum.Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


# Piped output is read by scripts and grep: never fold it (tools/output.py).
stdout = make_console()
stderr = make_console(stderr=True)


class CliError(Exception):
    """An error to print as one line with a given exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class ServiceUnreachable(CliError):
    """A service the command needs did not answer: names it, the URL tried and what sets
    the URL, in one line (exit 6)."""

    def __init__(self, service: str, url: str, why: str, setting: str) -> None:
        hint = ("" if os.environ.get("QUIRE_DATA_DIR") else
                "; for a `quire up` cluster in another data dir, set QUIRE_DATA_DIR")
        tail = f" (set {setting}{hint})" if setting else ""  # "": `why` names what to set
        super().__init__(f"{service} unreachable at {url}: {' '.join(why.split()) or 'no answer'}"
                         f"{tail}", EXIT_UNAVAILABLE)
        self.service, self.url = service, url


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, ApplyIncomplete):
        return exit_code_for(exc.cause)
    if isinstance(exc, StatusError):
        return _STATUS_EXIT.get(exc.status, EXIT_UNAVAILABLE)
    from fragment_store.verified import FragmentCorrupt

    if isinstance(exc, FragmentCorrupt):
        return EXIT_CORRUPT
    if isinstance(exc, (ValidationError, ValueError)):
        return EXIT_INVALID
    if isinstance(exc, ProtocolError):
        return EXIT_PROTOCOL
    if isinstance(exc, FileNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return EXIT_UNAVAILABLE
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_ERROR


def error_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (QuireError, CliError)):
        return f"error: {text}"
    return f"error: {type(exc).__name__}: {text}"


_settings: list[Settings] = []


def settings() -> Settings:
    """This process's settings (flags aside), loaded once: QUIRE_* variables, the config
    file, then a running local cluster's (protocol/discovery.py)."""
    if not _settings:
        from protocol.config import load_settings

        _settings.append(load_settings())
    return _settings[0]


def broker_endpoints(ctx: typer.Context) -> list[str]:
    obj = ctx.find_root().obj or {}
    value = obj.get("broker") or settings().broker or DEFAULT_BROKER
    return [e.strip() for e in value.split(",") if e.strip()]


def make_client(ctx: typer.Context) -> Client:
    obj = ctx.find_root().obj or {}
    return Client(broker_endpoints(ctx), retry_timeout=obj.get("timeout", 10.0),
                  connect_timeout=min(REACH_TIMEOUT, obj.get("timeout", 10.0)),
                  token=obj.get("token") or None)


REACH_TIMEOUT = 3.0
"""Seconds a command keeps trying to reach a first coordinator before it says so: a
cluster that is starting answers within this; one that is absent should not cost more."""


async def reach(client: Client, timeout: float) -> None:
    """Return once a coordinator answers Hello (the connection stays pooled for the
    command), or raise ServiceUnreachable naming what was tried and how to change it."""
    deadline = time.monotonic() + timeout
    reasons: dict[str, str] = {}
    tls: list[str] = []
    while True:
        for endpoint in client.endpoints:
            try:
                conn = await client.pool.acquire(endpoint)
            except Unavailable as exc:
                reasons[endpoint] = _why(exc)
                if isinstance(exc.__cause__, TLSRefused) and endpoint not in tls:
                    tls.append(endpoint)  # the reason names the TLS variable to set
                continue
            client.pool.release(conn)
            return
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    why = ("; ".join(f"{e}: {r}" for e, r in reasons.items()) if len(reasons) > 1
           else "".join(reasons.values()))
    raise ServiceUnreachable("coordinator", ",".join(client.endpoints), why,
                             "" if len(tls) == len(reasons) else "QUIRE_BROKER or --broker")


def _why(exc: BaseException) -> str:
    return connection_reason(exc)


def store_unreachable(exc: BaseException, store: Any, setting: str) -> ServiceUnreachable:
    """ServiceUnreachable for a store that did not answer: its URL, the S3 endpoint tried."""
    url = getattr(exc, "url", "") or getattr(store, "url", "")
    endpoint = getattr(store, "endpoint", None)
    if endpoint:
        scheme = "https" if getattr(store, "secure", False) else "http"
        url += f" (S3 endpoint {scheme}://{endpoint})"
        setting += "; QUIRE_S3_ENDPOINT for the endpoint"
    return ServiceUnreachable("store", url, _why(exc), setting)


def run(ctx: typer.Context, body: Callable[[Client], Coroutine[Any, Any, T]]) -> T:
    """Run `body(client)` on a fresh event loop and close the client afterwards; fail in
    a few seconds, in one line, when no coordinator can be reached at all."""
    obj = ctx.find_root().obj or {}

    async def main() -> T:
        async with make_client(ctx) as client:
            await reach(client, min(REACH_TIMEOUT, obj.get("timeout", 10.0)))
            return await body(client)

    return asyncio.run(main())


# -- output -------------------------------------------------------------------------------

def to_plain(value: Any) -> Any:
    """msgspec structs and enums as JSON/YAML-able builtins."""
    return msgspec.to_builtins(value)


def emit_json_lines(rows: Iterable[Any]) -> None:
    for row in rows:
        sys.stdout.write(json.dumps(to_plain(row), separators=(",", ":")) + "\n")
    sys.stdout.flush()


def emit_yaml(value: Any) -> None:
    sys.stdout.write(yaml.safe_dump(to_plain(value), sort_keys=False, default_flow_style=False))
    sys.stdout.flush()


def emit_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = make_table(title, columns, show_lines=False, header_style="bold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    stdout.print(table)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def progress_enabled() -> bool:
    """Progress bars go to stderr, and only when a human is watching."""
    return sys.stderr.isatty()


OutputOption = typer.Option(Output.table, "-o", "--output", help="table, json (JSON lines) or yaml.")

MaxTxnSizeOption = typer.Option(
    128, "--max-txn-size", min=1,
    help="Changes per etcd transaction (etcd's --max-txn-ops, 128 by default); a larger "
         "apply is cut into several transactions, each atomic (docs/operations.md).")
