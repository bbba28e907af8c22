"""`quire fragments list`, `quire brokers list`, `quire config print`."""

from __future__ import annotations

import datetime as dt
from typing import Any

import typer

from protocol import FragmentInfo

from .common import CliError, Output, OutputOption, emit_json_lines, emit_table, emit_yaml, human_bytes, run

fragments_app = typer.Typer(help="Fragments of a journal: local spools and persisted objects.",
                            no_args_is_help=True)
brokers_app = typer.Typer(help="Coordinators that are members of the cluster.", no_args_is_help=True)
config_app = typer.Typer(help="quire's effective settings.", no_args_is_help=True)


def fragment_path(info: FragmentInfo) -> str:
    """Where a persisted fragment lives (store URL + content-addressed key)."""
    frag = info.spec
    if not frag.backing_store:
        return ""
    try:
        from fragment_store.keys import fragment_key

        return frag.backing_store + fragment_key(frag)
    except ImportError:  # pragma: no cover - fragment_store ships with quire
        return frag.backing_store


def fragment_row(info: FragmentInfo) -> dict[str, Any]:
    frag = info.spec
    return {
        "journal": frag.journal, "begin": frag.begin, "end": frag.end,
        "size": frag.content_length, "sum": frag.sum, "codec": frag.codec.value,
        "persisted": frag.is_persisted, "local": info.local, "mod_time": frag.mod_time,
        "store": frag.backing_store, "path": fragment_path(info),
        **({"signed_url": info.signed_url} if info.signed_url else {}),
    }


@fragments_app.command("list")
def list_fragments(ctx: typer.Context,
                   journal: str = typer.Option(..., "-j", "--journal", help="Journal name."),
                   output: Output = OutputOption) -> None:
    """List a journal's fragments in offset order, persisted or still local."""
    infos = run(ctx, lambda c: c.list_fragments(journal))
    rows = [fragment_row(i) for i in infos]
    if output is Output.json:
        emit_json_lines(rows)
    elif output is Output.yaml:
        emit_yaml(rows)
    else:
        def where(r: dict[str, Any]) -> str:
            return "persisted" + (" + local" if r["local"] else "") if r["persisted"] else "local"

        def when(r: dict[str, Any]) -> str:
            if not r["mod_time"]:
                return "-"
            return dt.datetime.fromtimestamp(r["mod_time"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

        emit_table(f"{journal}: {len(rows)} fragments, {human_bytes(sum(r['size'] for r in rows))}",
                   ["begin", "end", "size", "codec", "where", "modified (UTC)", "path"],
                   [(r["begin"], r["end"], human_bytes(r["size"]), r["codec"], where(r), when(r),
                     r["path"] or "-") for r in rows])


@brokers_app.command("list")
def list_brokers(ctx: typer.Context, output: Output = OutputOption) -> None:
    """List coordinators: id, endpoint, journals assigned, primaries held and health."""
    brokers = run(ctx, lambda c: c.list_brokers())
    if output is Output.json:
        emit_json_lines(brokers)
    elif output is Output.yaml:
        emit_yaml(brokers)
    else:
        emit_table(None, ["zone", "id", "endpoint", "assigned", "primaries", "limit", "exiting",
                          "health"],
                   [(b.id.zone, b.id.suffix, b.endpoint, b.assigned, b.primaries, b.journal_limit,
                     "yes" if b.exiting else "", getattr(b, "health", "") or "ok")
                    for b in brokers])


@config_app.command("print")
def print_config(output: Output = typer.Option(Output.yaml, "-o", "--output",
                                               help="yaml (default), json or table."),
                 config: str = typer.Option(None, "--config", help="YAML settings file "
                                            "(default: $QUIRE_CONFIG).")) -> None:
    """Print the settings quire processes would use here (secrets masked)."""
    from protocol.config import ConfigError, load_settings

    try:
        settings = load_settings(config_path=config)
    except ConfigError as exc:
        raise CliError(str(exc), 7) from exc
    data = settings.redacted()
    if output is Output.json:
        emit_json_lines([data])
    elif output is Output.yaml:
        emit_yaml(data)
    else:
        emit_table(None, ["setting", "value"], sorted(data.items()))
