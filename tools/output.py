"""Human output that stays whole when it is not read by a human at a terminal.

At a terminal, rich fits tables to the window and folds long cells. Into a file or a
pipe (`make run > log`, `quire up > up.log`, `quire fragments list | grep`), folding
would split fragment names, store paths, keys and URLs over several lines, so there
nothing is folded: the console is as wide as the widest line and every column is
no-wrap. Long-running commands also make stdout line-buffered, so a script tailing
their log sees each line as it is printed. JSON and YAML output does not pass here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

__all__ = ["PIPED_WIDTH", "is_tty", "line_buffered", "make_console", "make_table"]

PIPED_WIDTH = 100_000
"""Console width when not a terminal: wider than any line we print, so nothing folds
(a table is only as wide as its content; it does not stretch to the console)."""


def is_tty(stream: TextIO | None = None) -> bool:
    stream = sys.stdout if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced by something without isatty
        return False


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that never folds when that stream is not a tty.
    It writes to whatever sys.stdout/sys.stderr is at print time (rich's default), and
    rich flushes after every print."""
    stream = sys.stderr if stderr else sys.stdout
    if is_tty(stream):
        return Console(stderr=stderr, soft_wrap=True)
    return Console(stderr=stderr, soft_wrap=True, width=PIPED_WIDTH)


def make_table(title: str | None, columns: Sequence[str], *, stream: TextIO | None = None,
               **kwargs: Any) -> Table:
    """A table whose cells fold at a terminal and never fold into a file or pipe."""
    table = Table(title=title, **kwargs)
    piped = not is_tty(stream)
    for col in columns:
        if piped:
            table.add_column(col, no_wrap=True, overflow="ignore")
        else:
            table.add_column(col, overflow="fold")
    return table


def line_buffered() -> None:
    """Make stdout and stderr flush at every newline (long-running commands into a log)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(line_buffering=True)
            except (ValueError, OSError):  # a detached or closed stream: nothing to buffer
                pass
