"""`quire fragments verify [-j JOURNAL]`: prove every persisted fragment by its SHA-1, now.

A one-shot scrub (fragment_store/scrub.py; the workers run the same walk on their beat,
workers/scrub.py): each fragment object of each store of the journal's spec (every
journal's, without -j) is fetched, decompressed and its SHA-1 compared with the one in
its name. A rotten copy is quarantined and mended from a good copy in another of the
journal's stores where one exists (`--no-repair`: only reported). Exits 10 naming every
copy no good copy could replace; 0 when everything proved itself (or was mended).
"""

from __future__ import annotations

from typing import Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from .common import (
    EXIT_CORRUPT,
    CliError,
    Output,
    OutputOption,
    emit_json_lines,
    progress_enabled,
    run,
    stderr,
    stdout,
    store_unreachable,
)
from .topology import fragments_app


@fragments_app.command("verify")
def verify(ctx: typer.Context,
           journal: str = typer.Option("", "-j", "--journal",
                                       help="Only this journal (default: every journal)."),
           repair: bool = typer.Option(True, "--repair/--no-repair",
                                       help="Quarantine a rotten copy and mend it from a good "
                                            "copy in another of the journal's stores."),
           rate: int = typer.Option(0, "--rate", min=0,
                                    help="At most this many content bytes/s (0 = unlimited)."),
           output: Output = OutputOption) -> None:
    """Prove every persisted fragment by its SHA-1; exit 10 naming what is corrupt."""
    from fragment_store import open_store
    from fragment_store.errors import StoreUnavailable
    from fragment_store.scrub import RateLimit, ScrubReport, journal_fragments, scrub_journal

    entries = run(ctx, lambda c: c.list_journals(""))
    specs = {e.spec.name: tuple(e.spec.fragment.stores) for e in entries
             if not journal or e.spec.name == journal}
    if journal and journal not in specs:
        raise CliError(f"journal {journal!r} not found", 3)
    objects: dict[str, list[Any]] = {}
    for name, stores in specs.items():
        try:
            objects[name] = journal_fragments(name, stores, open_store)
        except StoreUnavailable as exc:
            raise store_unreachable(exc, open_store(exc.url), f"fragment.stores of {name}'s spec") from None
    total_bytes = sum(f.content_length for objs in objects.values() for _, f in objs)
    report, limit = ScrubReport(), RateLimit(rate)
    with Progress("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=stderr, transient=True, disable=not progress_enabled()) as progress:
        task = progress.add_task("verifying", total=total_bytes)
        for name in sorted(objects):
            progress.update(task, description=name)
            report.add(scrub_journal(name, specs[name], open_store=open_store, repair=repair,
                                     limit=limit, objects=objects[name],
                                     progress=lambda _f, n: progress.advance(task, n)))
    rows = [{"journal": f.journal, "store": f.store, "key": f.key, "reason": f.reason,
             "mended": f.mended} for f in report.findings]
    if output is Output.json:
        emit_json_lines(rows)
    else:
        for f in report.findings:
            (stdout if f.mended else stderr).print(
                f"{'mended' if f.mended else 'CORRUPT'}: journal {f.journal}: {f}", markup=False,
                highlight=False)
        stdout.print(f"{report.fragments} fragments, {report.bytes} bytes proven in "
                     f"{len(specs)} journals; {len(report.findings)} rotten copies, "
                     f"{len(report.corrupt)} without a good copy", markup=False, highlight=False)
    for line in report.unreadable:
        stderr.print(f"unreadable: {line}", markup=False, highlight=False)
    if report.corrupt:
        names = ", ".join(f"{f.store}{f.key}" for f in report.corrupt)
        raise CliError(f"{len(report.corrupt)} corrupt fragment copies with no good copy: {names}",
                       EXIT_CORRUPT)
