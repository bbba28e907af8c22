"""`quire journals list|apply|delete|reset-head|suspend`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer

from protocol import ApplyChange, ListEntry
from protocol.apply_chunks import ApplyIncomplete, ApplyResult

from . import specs as specfile
from .store_check import check_spec_stores
from .common import (
    EXIT_NOT_FOUND,
    CliError,
    MaxTxnSizeOption,
    ServiceUnreachable,
    Output,
    OutputOption,
    emit_json_lines,
    emit_table,
    emit_yaml,
    human_bytes,
    run,
    settings,
    stdout,
    store_unreachable,
)

app = typer.Typer(help="List, create, change and delete journals.", no_args_is_help=True)

SelectorOption = typer.Option("", "-l", "--selector",
                              help="Label selector, e.g. 'topic=clicks, region in (eu, us)'.")


def _route(entry: ListEntry) -> str:
    members = entry.route.members
    return ", ".join(("*" if i == entry.route.primary else "") + str(m)
                     for i, m in enumerate(members)) or "-"


@app.command("list")
def list_journals(ctx: typer.Context, selector: str = SelectorOption,
                  stats: bool = typer.Option(False, "--stats",
                                             help="Storage per journal: fragments, stored bytes, "
                                                  "oldest/newest fragment, offsets covered."),
                  output: Output = OutputOption) -> None:
    """List journals matching a label selector (all by default)."""
    entries = run(ctx, lambda c: c.list_journals(selector))
    if stats:
        _print_stats(entries, output)
    elif output is Output.json:
        emit_json_lines(entries)
    elif output is Output.yaml:
        emit_yaml(specfile.render(entries))
    else:
        emit_table(None, ["name", "labels", "replication", "route (*primary)", "codec", "stores",
                          "revision"],
                   [(e.spec.name, str(e.spec.labels), e.spec.replication, _route(e),
                     e.spec.fragment.compression_codec.value, " ".join(e.spec.fragment.stores),
                     e.mod_revision) for e in entries])


def _print_stats(entries: list[ListEntry], output: Output) -> None:
    """One listing per store of each journal (the stores are authoritative), with the
    persistence backlog and the last persist failure (docs/operations.md)."""
    from fragment_store import open_store
    from fragment_store.errors import StoreUnavailable
    from fragment_store.persist import store_stats
    from fragment_store.stats import EMPTY, add

    rows = []
    for e in entries:
        total = EMPTY
        for url in e.spec.fragment.stores:
            store = open_store(url)
            try:
                total = add(total, store_stats(store, e.spec.name))
            except StoreUnavailable as exc:
                raise store_unreachable(exc, store, f"fragment.stores of {e.spec.name}'s spec") from None
        rows.append({"journal": e.spec.name, **total._asdict()})
    marks = _watermarks([r["journal"] for r in rows])
    backlog, failures = persist_status()
    now = time.time()
    for r in rows:
        r["watermark"] = marks.get(r["journal"], 0.0)
        b = backlog.get(r["journal"]) if backlog is not None else None
        r["backlog_bytes"] = b.bytes if b is not None else (0 if backlog is not None else None)
        r["backlog_age"] = round(b.age(now), 1) if b is not None else (0.0 if backlog is not None else None)
        f = (failures or {}).get(r["journal"])
        r["persist_error"] = (f"{f.reason}: {f.message} ({f.count}x, last "
                              f"{max(0, int(now - f.last))}s ago)") if f is not None else ""
    if output is Output.json:
        emit_json_lines(rows)
    elif output is Output.yaml:
        emit_yaml(rows)
    else:
        def when(t: int) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else "-"

        def backlog_cell(r: dict) -> tuple[str, str]:
            if r["backlog_bytes"] is None:
                return "?", "?"
            if not r["backlog_bytes"]:
                return "0", "-"
            return human_bytes(r["backlog_bytes"]), f"{r['backlog_age']:.0f}s"

        emit_table(None, ["name", "fragments", "stored", "oldest (UTC)", "newest (UTC)", "offsets",
                          "persisted watermark (UTC)", "backlog", "backlog age", "persist error"],
                   [(r["journal"], r["fragments"], human_bytes(r["stored_bytes"]),
                     when(r["oldest"]), when(r["newest"]),
                     f"{r['begin']}..{r['end']}" if r["fragments"] else "-",
                     when(int(r["watermark"])), *backlog_cell(r), r["persist_error"] or "-")
                    for r in rows])


def persist_status() -> tuple[dict | None, dict | None]:
    """(journal -> PersistBacklog, journal -> PersistFailure) from the workers' Redis at
    $QUIRE_REDIS_URL (fragment_store/persist_status.py); (None, None) when it is unset or
    unreachable (the columns then show '?')."""
    import os

    url = os.environ.get("QUIRE_REDIS_URL", "")
    if not url:
        return None, None
    import redis

    from fragment_store.persist_status import read_backlog, read_failures

    try:
        client = redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
        try:
            return read_backlog(client), read_failures(client)
        finally:
            client.close()
    except redis.RedisError:
        return None, None


def _watermarks(journals: list[str]) -> dict[str, float]:
    """Persisted watermarks (docs/jobs.md) from the workers' Redis at $QUIRE_REDIS_URL;
    none when it is unset or unreachable (the column then shows '-')."""
    import os

    url = os.environ.get("QUIRE_REDIS_URL", "")
    if not url or not journals:
        return {}
    import redis

    from fragment_store.index_keys import WATERMARKS_KEY

    try:
        client = redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
        values = client.hmget(WATERMARKS_KEY, journals)
        client.close()
    except redis.RedisError:
        return {}
    return {j: float(v) for j, v in zip(journals, values, strict=True) if v}


@app.command("apply")
def apply(ctx: typer.Context,
          file: str = typer.Option(..., "-f", "--file", "--specs",
                                   help="YAML spec tree ('-' for stdin)."),
          dry_run: bool = typer.Option(False, "--dry-run",
                                       help="Parse and validate, print the changes, apply nothing."),
          max_txn_size: int = MaxTxnSizeOption,
          output: Output = OutputOption) -> None:
    """Create, update or delete journals from a YAML spec tree: unchanged specs are
    skipped, the rest written in transactions of at most --max-txn-size changes."""
    if file == "-":
        text, source = sys.stdin.read(), "stdin"
    else:
        path = Path(file)
        if not path.is_file():
            raise CliError(f"spec file {file} not found", EXIT_NOT_FOUND)
        text, source = path.read_text(), path.name
    changes = specfile.parse(text, source)
    if not changes:
        raise CliError(f"{source} holds no journals", 7)
    check_spec_stores(changes)  # refused (auth on) / warned: a store no live worker writes to
    if dry_run:
        _print_changes(changes, output, None)
        return
    try:
        result = run(ctx, lambda c: c.apply_chunked(changes, max_txn_size=max_txn_size))
    except ApplyIncomplete as exc:
        _print_changes(changes, output, exc)
        raise
    _print_changes(changes, output, result)


def _print_changes(changes: list[ApplyChange], output: Output,
                   result: ApplyResult | ApplyIncomplete | None) -> None:
    """Each change with what became of it: applied, unchanged, or not applied."""
    applied = set(result.applied) if result is not None else set()
    unchanged = set(result.unchanged) if result is not None else set()
    revision = result.revision if result is not None else None
    rows = []
    for c in changes:
        name = c.delete or (c.upsert.name if c.upsert else "")
        rows.append({"action": "delete" if c.delete else "upsert", "journal": name,
                     "expect_mod_revision": c.expect_mod_revision,
                     "result": "dry run" if result is None else "applied" if name in applied
                     else "unchanged" if name in unchanged else "not applied"})
    if output is Output.json:
        emit_json_lines(rows if revision is None else [{**r, "revision": revision} for r in rows])
    elif output is Output.yaml:
        emit_yaml({"revision": revision, "dry_run": result is None, "changes": rows})
    else:
        if result is None:
            title = "dry run: nothing applied"
        else:
            title = (f"applied {len(applied)}, unchanged {len(unchanged)}"
                     + (f", not applied {len(result.not_applied)}"
                        if isinstance(result, ApplyIncomplete) else "")
                     + (f" (at revision {revision})" if applied else ""))
        emit_table(title, ["action", "journal", "expected revision", "result"],
                   [(r["action"], r["journal"], r["expect_mod_revision"], r["result"]) for r in rows])


@app.command("delete")
def delete(ctx: typer.Context, name: str = typer.Argument(..., help="Journal name."),
           purge: bool = typer.Option(False, "--purge",
                                      help="Also remove its objects from its stores, after --grace."),
           grace: float = typer.Option(3600.0, "--grace",
                                       help="Seconds before --purge removes the objects."),
           output: Output = OutputOption) -> None:
    """Delete a journal's spec; its persisted fragments stay unless --purge."""
    stores: tuple[str, ...] = ()
    if purge:
        entries = run(ctx, lambda c: c.list_journals(""))
        spec = next((e.spec for e in entries if e.spec.name == name), None)
        stores = spec.fragment.stores if spec is not None else ()
    revision = run(ctx, lambda c: c.delete(name))
    row: dict = {"journal": name, "deleted": True, "revision": revision}
    text = f"deleted {name} at revision {revision}"
    if purge and stores:
        import time

        # Runs after the grace: its APPLY token is valid from then, for minutes.
        extra = destructive_kwargs(name, not_before=time.time() + max(0.0, grace))
        celery = celery_for_cli(settings().redis_url)
        try:
            celery.send_task("workers.prune.purge_journal", args=[name, list(stores)],
                             kwargs=extra, queue="prune", countdown=max(0.0, grace))
        finally:
            celery.close()
        row["purge_after"] = grace
        text += f"; its objects will be purged in {grace:g}s"
    _report(output, row, text)


def destructive_kwargs(journal: str, not_before: float | None = None) -> dict[str, str]:
    """With the cluster's keys (QUIRE_AUTH_KEYS_FILE: an operator), sign the task messages
    this process sends and give a destructive task its APPLY token on `journal`
    (docs/security.md). Without keys, nothing: an auth-on cluster's workers refuse it."""
    from protocol.auth import Capability, Scope
    from protocol.config import load_settings
    from protocol.credentials import settings_keyring
    from protocol.redis_security import sign_published_tasks
    from protocol.task_signing import DESTRUCTIVE_TTL

    ring = settings_keyring(load_settings())
    sign_published_tasks(ring.task_keys() if ring is not None else None)
    if ring is None:
        return {}
    return {"capability": ring.mint(Capability.APPLY, Scope.of([journal]), DESTRUCTIVE_TTL,
                                    "quire-cli", now=not_before)}


@app.command("reset-head")
def reset_head(ctx: typer.Context,
               journal: str = typer.Option(..., "-j", "--journal", help="Journal name."),
               output: Output = OutputOption) -> None:
    """Move the journal's append offset to the highest offset any replica or store holds
    (after losing replicas, or when the store has content the brokers lack)."""
    result = run(ctx, lambda c: c.reset_head(journal))
    _report(output, {"journal": journal, "write_head": result.end},
            f"{journal}: write head is now {result.end}")


@app.command("suspend")
def suspend(ctx: typer.Context,
            journal: str = typer.Option(..., "-j", "--journal", help="Journal name."),
            force: bool = typer.Option(False, "--force",
                                       help="Suspend now, even if not yet fully persisted."),
            output: Output = OutputOption) -> None:
    """Suspend an idle journal: its replicas are released until the next append."""
    result = run(ctx, lambda c: c.suspend(journal, force=force))
    _report(output, {"journal": journal, "offset": result.end, "suspended": True},
            f"{journal}: suspend requested at offset {result.end}")


@app.command("prune")
def prune(ctx: typer.Context, selector: str = SelectorOption,
          dry_run: bool = typer.Option(False, "--dry-run",
                                       help="List what would be removed, remove nothing."),
          timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the workers."),
          output: Output = OutputOption) -> None:
    """Remove fragments older than each selected journal's retention, through the
    workers' `prune` task (never unpersisted content, the head, or beyond a guard)."""
    entries = run(ctx, lambda c: c.list_journals(selector))
    url = settings().redis_url
    celery = celery_for_cli(url)
    try:
        sent = [celery.send_task("workers.prune.prune_journal", args=[e.spec.name, dry_run],
                                 kwargs=destructive_kwargs(e.spec.name), queue="prune")
                for e in entries]
        plans = [r.get(timeout=timeout) for r in sent]
    except ServiceUnreachable:
        raise
    except Exception as exc:  # noqa: BLE001 - one line, non-zero exit
        if _redis_failure(exc):
            raise ServiceUnreachable("Redis", url, str(exc), "QUIRE_REDIS_URL") from None
        raise CliError(f"prune task failed: {type(exc).__name__}: {exc}") from None
    finally:
        celery.close()
    rows = [{"journal": p["journal"], "dry_run": dry_run, **r} for p in plans for r in p["removed"]]
    if output is Output.json:
        emit_json_lines(rows)
    elif output is Output.yaml:
        emit_yaml(rows)
    else:
        title = f"{'would remove' if dry_run else 'removed'} {len(rows)} fragments"
        emit_table(title, ["journal", "begin", "end", "key", "store"],
                   [(r["journal"], r["begin"], r["end"], r["key"], r["store"]) for r in rows])


def celery_for_cli(url: str) -> Any:
    """A by-name Celery client whose Redis answered a ping (else ServiceUnreachable in at
    most a few seconds) and whose broker and result backend give up in seconds, not
    Celery's minutes of reconnecting, if Redis goes away while the command waits."""
    import redis

    from tools.services import celery_client

    try:
        with redis.Redis.from_url(url, socket_connect_timeout=REDIS_TIMEOUT,
                                  socket_timeout=REDIS_TIMEOUT) as r:
            r.ping()
    except redis.RedisError as exc:
        cause = exc.__cause__ or exc.__context__
        why = "connection refused" if isinstance(cause, ConnectionRefusedError) else str(exc)
        raise ServiceUnreachable("Redis", url, why, "QUIRE_REDIS_URL") from None
    app = celery_client(url)
    quick = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}
    app.conf.update(
        broker_connection_retry=False, broker_connection_max_retries=1,
        broker_connection_timeout=REDIS_TIMEOUT, task_publish_retry_policy=quick,
        broker_transport_options={**quick, "socket_connect_timeout": REDIS_TIMEOUT},
        redis_socket_connect_timeout=REDIS_TIMEOUT, redis_retry_on_timeout=False,
        result_backend_transport_options={"retry_policy": quick},
    )
    return app


REDIS_TIMEOUT = 2.0
"""Seconds the CLI waits for Redis to accept a connection."""


def _redis_failure(exc: BaseException) -> bool:
    """Whether `exc` (from Celery, kombu or redis-py) means Redis went away."""
    import kombu.exceptions
    import redis

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (redis.ConnectionError, redis.TimeoutError,
                             kombu.exceptions.OperationalError)):
            return True
        if "result store backend" in str(seen) or "Retry limit exceeded" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _report(output: Output, row: dict, text: str) -> None:
    if output is Output.json:
        emit_json_lines([row])
    elif output is Output.yaml:
        emit_yaml(row)
    else:
        stdout.print(text, markup=False, highlight=False)
