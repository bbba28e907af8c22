"""`quire shards list|apply|delete|checkpoint`: consumer shard specs in etcd.

Shard specs live in etcd (topology/shards.py), not behind a coordinator RPC, so these
commands talk to etcd directly (`--etcd`, default $QUIRE_ETCD_URL, else the local cluster
`quire up` runs). Spec file format:

    common:                       # optional: defaults every shard below inherits
      recovery_log_prefix: recovery/counts
      checkpoint_interval: 1s
      labels: {app: counts}
    shards:
      - id: counts-000
        sources: [{journal: clicks/part-000}]
      - id: counts-001
        sources: [{selector: "topic=clicks, part=001", min_offset: 1024}]
        hot_standbys: 1
        revision: 42              # optional: apply only if still at this mod revision
      - id: old-shard
        delete: true

A file may also be a plain list of shards (or several YAML documents).
`list -o yaml` prints this format with every shard's revision, so it round-trips.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import typer
import yaml

from protocol import LabelSet, parse_duration
from protocol.errors import ValidationError
from protocol.shard import ShardSpec, ShardStatus
from aetcd.exceptions import ConnectionFailedError, ConnectionTimeoutError

from protocol.discovery import effective_env
from topology.etcd import EtcdError, connect
from topology.etcd_client import EtcdTLS
from topology.shards import (
    ShardChange,
    ShardEntry,
    apply_shards,
    delete_shard,
    get_shard,
    list_shards,
    list_statuses,
    read_primaries,
    request_checkpoint,
)

from .common import (
    EXIT_UNAVAILABLE,
    CliError,
    MaxTxnSizeOption,
    Output,
    OutputOption,
    ServiceUnreachable,
    emit_json_lines,
    emit_table,
    emit_yaml,
    human_bytes,
    settings,
    stdout,
)
from .specs import _labels_to_mapping

T = TypeVar("T")

app = typer.Typer(help="List, create, change, delete and checkpoint consumer shards.",
                  no_args_is_help=True)

EtcdOption = typer.Option(None, "--etcd", help="etcd URL (default $QUIRE_ETCD_URL or "
                          "http://127.0.0.1:2379).")
RootOption = typer.Option(None, "--root", help="etcd key prefix (default $QUIRE_ETCD_ROOT or /quire).")

_NODE_KEYS = {"revision", "delete"}
ETCD_PROBE = 3.0
"""Seconds for an etcd member to answer before a command says etcd is unreachable."""


def _run(etcd: str | None, body: Callable[[Any], Awaitable[T]]) -> T:
    url = etcd or settings().etcd_url

    async def main() -> T:
        # probe: one member answers within seconds, else EtcdError names etcd, the URLs
        # and QUIRE_ETCD_URL; TLS files as discovered for a local cluster too.
        try:
            client = await asyncio.wait_for(
                connect(url, probe=ETCD_PROBE, tls=EtcdTLS.from_env(effective_env()),
                        root=_root(None)),
                ETCD_PROBE + 1.0)
        except asyncio.TimeoutError:
            raise ServiceUnreachable("etcd", url, f"no answer within {ETCD_PROBE + 1.0:g}s",
                                     "QUIRE_ETCD_URL or --etcd") from None
        try:
            return await body(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except (EtcdError, ConnectionFailedError, ConnectionTimeoutError) as exc:
        text = " ".join(str(exc).split())
        if "QUIRE_ETCD_URL" in text:  # already says what it tried and what sets it
            raise CliError(text.removeprefix("UNAVAILABLE: "), EXIT_UNAVAILABLE) from None
        raise ServiceUnreachable("etcd", url, text.rpartition(": ")[2] or type(exc).__name__,
                                 "QUIRE_ETCD_URL or --etcd") from None


def _root(root: str | None) -> str:
    return root or settings().etcd_root


# -- spec files ---------------------------------------------------------------------------

def _to_spec(data: dict[str, Any], path: str) -> ShardSpec:
    fields = {k: v for k, v in data.items() if k not in _NODE_KEYS and v is not None}
    if "labels" in fields:
        fields["labels"] = LabelSet.of(_labels_to_mapping(fields["labels"], f"{path}.labels"))
    if "checkpoint_interval" in fields:
        fields["checkpoint_interval"] = parse_duration(fields["checkpoint_interval"],
                                                       f"{path}.checkpoint_interval")
    sources = fields.get("sources")
    if isinstance(sources, list):
        fields["sources"] = [{"journal": s} if isinstance(s, str) else s for s in sources]
    try:
        spec = msgspec.convert(fields, ShardSpec, str_keys=True)
    except msgspec.ValidationError as exc:
        # msgspec names the field as `$.sources[0].min_offset`; keep that path.
        text = str(exc)
        where = text.rpartition(" - at `$")[2].rstrip("`") if " - at `$" in text else ""
        raise ValidationError(f"{path}{where}", text.partition(" - at `")[0]) from None
    try:
        spec.validate()
    except ValidationError as exc:
        raise exc.within(path) from None
    return spec


def parse(text: str, source: str = "shards") -> list[ShardChange]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ValidationError(source, f"not valid YAML: {' '.join(str(exc).split())}") from None
    changes: list[ShardChange] = []
    seen: set[str] = set()
    for d, doc in enumerate(docs):
        where = f"{source}[{d}]" if len(docs) > 1 else source
        common: dict[str, Any] = {}
        if isinstance(doc, dict) and ("shards" in doc or "common" in doc):
            common = doc.get("common") or {}
            if not isinstance(common, dict):
                raise ValidationError(f"{where}.common", "expected a mapping")
            items, where = doc.get("shards") or [], f"{where}.shards"
        elif isinstance(doc, list):
            items = doc
        else:
            items = [doc]
        if not isinstance(items, list):
            raise ValidationError(where, "expected a list of shards")
        for i, item in enumerate(items):
            path = f"{where}[{i}]"
            if not isinstance(item, dict) or not item.get("id"):
                raise ValidationError(path, "expected a mapping with at least an id")
            merged = {**common, **item}
            if isinstance(common.get("labels"), dict) and isinstance(item.get("labels"), dict):
                merged["labels"] = {**common["labels"], **item["labels"]}
            shard_id = str(merged["id"])
            if shard_id in seen:
                raise ValidationError(path, f"shard {shard_id!r} appears twice")
            seen.add(shard_id)
            revision = merged.get("revision", -1)
            if not isinstance(revision, int) or revision < -1:
                raise ValidationError(f"{path}.revision", f"{revision!r} is not -1, 0 or a revision")
            if merged.get("delete"):
                changes.append(ShardChange(delete=shard_id, expect_mod_revision=revision))
            else:
                changes.append(ShardChange(spec=_to_spec(merged, path), expect_mod_revision=revision))
    return changes


def render(entries: list[ShardEntry]) -> dict[str, Any]:
    shards = []
    for e in entries:
        data = msgspec.to_builtins(e.spec)
        labels = e.spec.labels.as_dict()
        data["labels"] = {k: (v[0] if len(v) == 1 else v) for k, v in labels.items()}
        shards.append({**data, "revision": e.mod_revision})
    return {"shards": shards}


# -- commands -----------------------------------------------------------------------------

def _primary_status(statuses: list[ShardStatus], primary: str) -> ShardStatus | None:
    for s in statuses:
        if s.member == primary:
            return s
    return None


def _state(spec: ShardSpec, status: ShardStatus | None, reports: list[ShardStatus]) -> tuple[str, str]:
    """(state, why): the primary's state, else FAILED if a member reports a failure."""
    if spec.disable:
        return "DISABLED", ""
    if status is not None:
        return status.state.value, status.message
    failed = [r for r in reports if r.state.value == "FAILED"]
    if failed:
        return "FAILED", f"{failed[0].member}: {failed[0].message}"
    return "IDLE", ""


@app.command("list")
def list_cmd(etcd: str = EtcdOption, root: str = RootOption, output: Output = OutputOption) -> None:
    """Every shard: its state, primary, read-through offsets and lag per source."""
    r = _root(root)

    async def body(client: Any) -> tuple[list[ShardEntry], dict[str, tuple[str, int]],
                                         dict[str, list[ShardStatus]]]:
        return (await list_shards(client, r), await read_primaries(client, r),
                await list_statuses(client, r))

    entries, primaries, statuses = _run(etcd, body)
    if output is Output.yaml:
        emit_yaml(render(entries))
        return
    rows = []
    for e in entries:
        primary = primaries.get(e.spec.id, ("", 0))[0]
        reports = statuses.get(e.spec.id, [])
        status = _primary_status(reports, primary)
        rows.append((e, primary, status, reports))
    if output is Output.json:
        emit_json_lines({
            "id": e.spec.id, "spec": e.spec, "revision": e.mod_revision,
            "state": _state(e.spec, status, reports)[0],
            "message": _state(e.spec, status, reports)[1],
            "primary": primary or None,
            "sources": [{"journal": s.journal, "offset": s.offset, "write_head": s.write_head,
                         "lag": s.lag} for s in (status.sources if status else ())],
            "log_offset": status.log_offset if status else 0,
            "transactions": status.transactions if status else 0,
            "members": [{"member": s.member, "state": s.state.value} for s in reports],
        } for e, primary, status, reports in rows)
        return
    table = []
    for e, primary, status, reports in rows:
        state, why = _state(e.spec, status, reports)
        if why:
            state += f"\n{why}"
        standbys = [f"{s.member}:{s.state.value}" for s in reports if s.member != primary]
        offsets = "\n".join(f"{s.journal}@{s.offset} (lag {human_bytes(s.lag)})"
                            for s in (status.sources if status else ())) or "-"
        age = f"{time.time() - status.updated:.0f}s ago" if status and status.updated else "-"
        table.append((e.spec.id, state, primary or "-", " ".join(standbys) or "-", offsets,
                      status.transactions if status else 0, age, e.mod_revision))
    emit_table(None, ["id", "state", "primary", "standbys", "read-through (lag)", "txns",
                      "reported", "revision"], table)


@app.command("apply")
def apply_cmd(file: Path = typer.Option(..., "-f", "--file", help="Shard spec YAML ('-' = stdin)."),
              dry_run: bool = typer.Option(False, "--dry-run", help="Validate only."),
              max_txn_size: int = MaxTxnSizeOption,
              etcd: str = EtcdOption, root: str = RootOption) -> None:
    """Create, update or delete shards from a spec file: unchanged specs are skipped, the
    rest written in transactions of at most --max-txn-size changes."""
    text = typer.get_text_stream("stdin").read() if str(file) == "-" else file.read_text()
    changes = parse(text, str(file))
    if dry_run:
        stdout.print(f"{len(changes)} shard change(s) valid")
        return
    result = _run(etcd, lambda c: apply_shards(c, _root(root), changes, max_txn_size=max_txn_size))
    stdout.print(applied_line(result, "shard"))


def applied_line(result: Any, what: str) -> str:
    """`applied 3 shard change(s) in 1 transaction(s) at revision 42, 2 unchanged`."""
    text = f"applied {len(result.applied)} {what} change(s)"
    if result.transactions:
        text += f" in {result.transactions} transaction(s) at revision {result.revision}"
    return text + f", {len(result.unchanged)} unchanged"


@app.command("delete")
def delete_cmd(shard_id: str = typer.Argument(..., metavar="ID"),
               revision: int = typer.Option(-1, "--revision", help="Only if still at this revision."),
               etcd: str = EtcdOption, root: str = RootOption) -> None:
    """Delete a shard spec; its primary releases it."""
    rev = _run(etcd, lambda c: delete_shard(c, _root(root), shard_id, revision))
    stdout.print(f"deleted shard {shard_id} at revision {rev}")


@app.command("checkpoint")
def checkpoint_cmd(shard_id: str = typer.Argument(..., metavar="ID"),
                   etcd: str = EtcdOption, root: str = RootOption) -> None:
    """Ask the shard's primary to commit (and snapshot) at its next message boundary."""
    rev = _run(etcd, lambda c: request_checkpoint(c, _root(root), shard_id))
    stdout.print(f"checkpoint notice for {shard_id} at revision {rev}")


@app.command("get")
def get_cmd(shard_id: str = typer.Argument(..., metavar="ID"), etcd: str = EtcdOption,
            root: str = RootOption, output: Output = OutputOption) -> None:
    """One shard's spec."""
    entry = _run(etcd, lambda c: get_shard(c, _root(root), shard_id))
    if output is Output.json:
        emit_json_lines([{"spec": entry.spec, "revision": entry.mod_revision}])
    else:
        emit_yaml(render([entry]))
