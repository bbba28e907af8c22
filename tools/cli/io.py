"""`quire append` and `quire read`: journal content in and out."""

from __future__ import annotations

import asyncio
import enum
import json
import sys
from pathlib import Path
from typing import Any, BinaryIO

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from quire.client import AppendService, Client, LineFramer, Producer
from quire.client.messages import FramingError, decode

from .common import (
    EXIT_NOT_FOUND,
    CliError,
    Output,
    OutputOption,
    emit_json_lines,
    emit_yaml,
    progress_enabled,
    run,
    stderr,
    stdout,
)


class Framing(str, enum.Enum):
    none = "none"
    lines = "lines"


class ReadOutput(str, enum.Enum):
    raw = "raw"
    json = "json"


class _Counting:
    """A binary file that reports bytes read to a progress bar."""

    def __init__(self, f: BinaryIO, progress: Progress, task: Any) -> None:
        self._f, self._progress, self._task = f, progress, task

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._progress.advance(self._task, len(data))
        return data

    def seekable(self) -> bool:
        return self._f.seekable()

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        self._progress.update(self._task, completed=pos)
        return self._f.seek(pos, whence)


def _open_inputs(files: list[Path] | None) -> list[tuple[str, BinaryIO, int | None]]:
    if not files or [str(f) for f in files] == ["-"]:
        return [("stdin", sys.stdin.buffer, None)]
    out = []
    for path in files:
        if not path.is_file():
            raise CliError(f"input file {path} not found", EXIT_NOT_FOUND)
        out.append((str(path), open(path, "rb"), path.stat().st_size))  # noqa: SIM115
    return out


async def _append_streams(client: Client, journal: str, inputs, progress: Progress | None,
                          producer: Producer | None = None) -> list[dict]:
    results = []
    history = producer.history() if producer is not None else None
    for name, f, size in inputs:
        body: Any = f
        if history is not None and not f.seekable():
            # An identified append is re-sent until it is answered: it must rewind.
            body = await asyncio.to_thread(f.read)
        elif progress is not None:
            body = _Counting(f, progress, progress.add_task(name, total=size))
        # Each input is one transaction, streamed: the whole file lands or none of it.
        r = await client.append(journal, body, txn=history.next() if history else None)
        results.append({"journal": journal, "input": name, "begin": r.begin, "end": r.end,
                        "bytes": r.end - r.begin})
    return results


async def _append_lines(client: Client, journal: str, inputs,
                        producer: Producer | None = None) -> list[dict]:
    messages, total, first, last = 0, 0, None, None
    async with AppendService(client, exactly_once=producer is not None, producer=producer) as svc:
        futures = []
        for _, f, _ in inputs:
            tail = b""
            while True:
                # A thread: stdin may block, and the service's writer must keep running.
                chunk = await asyncio.to_thread(f.read, 1 << 16)
                if not chunk:
                    break
                lines = (tail + chunk).split(b"\n")
                tail = lines.pop()
                for line in lines:
                    futures.append(await svc.append(journal, line + b"\n"))
            if tail:  # a final line without its newline is still a whole message
                futures.append(await svc.append(journal, tail + b"\n"))
        await svc.flush()
    for fut in futures:
        r = fut.result()  # raises the batch's error, if any
        messages += 1
        total += r.end - r.begin
        first = r.begin if first is None else min(first, r.begin)
        last = r.end if last is None else max(last, r.end)
    return [{"journal": journal, "messages": messages, "bytes": total,
             "begin": first or 0, "end": last or 0}]


def append(ctx: typer.Context,
           journal: str = typer.Option(..., "-j", "--journal", help="Journal to append to."),
           files: list[Path] = typer.Argument(None, help="Input files ('-' or none: stdin)."),
           framing: Framing = typer.Option(Framing.none, "--framing",
                                           help="none: each input is one append; lines: each "
                                                "line is a message, batched."),
           producer_name: str = typer.Option(
               None, "--producer", help="Exactly-once: identify every append as this producer "
               "(a new generation per run, persisted under --state-dir); re-sent until answered, "
               "landing once (docs/exactly-once.md)."),
           state_dir: Path = typer.Option(None, "--state-dir",
                                          help="Where producer generations are kept "
                                               "(default: <data dir>/producers)."),
           output: Output = OutputOption) -> None:
    """Append files (or stdin) to a journal."""
    producer = None
    if producer_name:
        try:
            producer = Producer.start(producer_name, state_dir)
        except (ValueError, OSError) as exc:
            raise CliError(f"--producer: {exc}") from None
    inputs = _open_inputs(files)
    try:
        if framing is Framing.lines:
            results = run(ctx, lambda c: _append_lines(c, journal, inputs, producer))
        elif progress_enabled() and any(size for _, _, size in inputs):
            with Progress("{task.description}", BarColumn(), DownloadColumn(),
                          TransferSpeedColumn(), console=stderr, transient=True) as progress:
                results = run(ctx, lambda c: _append_streams(c, journal, inputs, progress, producer))
        else:
            results = run(ctx, lambda c: _append_streams(c, journal, inputs, None, producer))
    finally:
        for _, f, _ in inputs:
            if f is not sys.stdin.buffer:
                f.close()
    if output is Output.json:
        emit_json_lines(results)
    elif output is Output.yaml:
        emit_yaml(results)
    else:
        for r in results:
            what = f"{r['messages']} messages, " if "messages" in r else ""
            stdout.print(f"appended {what}{r['bytes']} bytes to {journal} at "
                         f"[{r['begin']}, {r['end']})", markup=False, highlight=False)


def read(ctx: typer.Context,
         journal: str = typer.Option(..., "-j", "--journal", help="Journal to read."),
         offset: int = typer.Option(0, "--offset", help="Start offset; -1 = the write head."),
         follow: bool = typer.Option(False, "-f", "--follow",
                                     help="Keep reading as content is appended (like tail -f)."),
         block: bool = typer.Option(False, "--block", help="Wait for content once at the head."),
         end_offset: int = typer.Option(0, "--end-offset", help="Stop before this offset."),
         from_store: bool = typer.Option(False, "--from-store",
                                         help="Read persisted fragments straight from the store "
                                              "(each proven by its SHA-1 before a byte is printed)."),
         unverified: bool = typer.Option(False, "--unverified-reads-risk-corruption",
                                         help="With --from-store: print stored bytes without "
                                              "proving them; a rotten byte in the store is "
                                              "printed as if it were content."),
         output: ReadOutput = typer.Option(ReadOutput.raw, "--output", "-o",
                                           help="raw bytes, or json: one line per message "
                                                "{journal, offset, value}.")) -> None:
    """Read a journal from an offset to its write head (or forever with --follow)."""

    async def go(client: Client) -> None:
        reader = client.read(journal, offset, block=block, follow=follow, end_offset=end_offset,
                             from_store=from_store, unverified_reads_risk_corruption=unverified)
        framer = LineFramer()
        previous_end = None
        out = sys.stdout.buffer
        async with reader:
            async for at, data in reader:
                if previous_end is not None and at > previous_end:
                    stderr.print(f"warning: offset jump from {previous_end} to {at} in {journal} "
                                 "(content removed from every store)", markup=False)
                previous_end = at + len(data)
                if output is ReadOutput.raw:
                    out.write(data)
                    out.flush()
                    continue
                for msg_at, line in framer.feed(at, data):
                    out.write(_json_line(journal, msg_at, line))
                out.flush()
        if framer.pending:
            stderr.print(f"warning: {framer.pending} bytes of an incomplete message at offset "
                         f"{framer.next_offset} not shown", markup=False)

    run(ctx, go)


def _json_line(journal: str, offset: int, line: bytes) -> bytes:
    text = line.rstrip(b"\n")
    try:
        value = decode(text)
    except FramingError:
        value = text.decode("utf-8", errors="replace")
    return (json.dumps({"journal": journal, "offset": offset, "value": value},
                       separators=(",", ":")) + "\n").encode()
