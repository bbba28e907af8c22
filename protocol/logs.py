"""Structured logging for every quire process.

structlog is wired to the standard library at import, so a logger obtained
before `configure_logging()` runs (a module-level `log = get_logger(...)`)
still ends up in the handler installed later. `configure_logging()` only
installs that one root handler, whose formatter renders JSON or console
output; stdlib loggers (Celery, kombu, asyncio) go through the same renderer
and carry the same bound context.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TextIO

import structlog
from structlog.contextvars import bind_contextvars, reset_contextvars
from structlog.types import Processor

__all__ = ["bind", "configure_logging", "get_logger"]

LogFormat = Literal["auto", "json", "console"]

# Applied to structlog events before they become stdlib records, and to
# foreign stdlib records before rendering, so both look the same.
_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
]

structlog.configure(
    processors=[
        structlog.stdlib.filter_by_level,
        *_SHARED,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    # Safe to cache: this configuration never changes, only the handler does.
    cache_logger_on_first_use=True,
)


class _QuireHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler we own, so reconfiguring replaces it instead of
    stacking a second one (which would print every line twice)."""


def _resolve_format(format: str, stream: TextIO) -> Literal["json", "console"]:
    if format not in ("auto", "json", "console"):
        raise ValueError(f"log format: expected auto|json|console, got {format!r}")
    if format == "auto":
        isatty = getattr(stream, "isatty", None)
        return "console" if isatty is not None and isatty() else "json"
    return format  # type: ignore[return-value]


def configure_logging(
    format: LogFormat | str = "auto",
    level: str | int = "INFO",
    *,
    stream: TextIO | None = None,
) -> None:
    """Route all logging to `stream` (default stdout) as JSON or console text.

    Idempotent: calling it again replaces the previous handler and level.
    """
    stream = sys.stdout if stream is None else stream
    fmt = _resolve_format(format, stream)
    lvl = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(lvl, int):
        raise ValueError(f"log level: expected DEBUG|INFO|WARNING|ERROR|CRITICAL, got {level!r}")

    if fmt == "json":
        render: list[Processor] = [
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ]
    else:
        render = [structlog.dev.ConsoleRenderer(colors=bool(getattr(stream, "isatty", bool)()))]

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
    )
    handler = _QuireHandler(stream)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _QuireHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(lvl)


def get_logger(name: str | None = None, **initial: Any) -> structlog.stdlib.BoundLogger:
    log: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return log.bind(**initial) if initial else log


@contextmanager
def bind(
    *,
    journal: str | None = None,
    route: Any = None,
    fragment: Any = None,
    revision: int | None = None,
    **extra: Any,
) -> Iterator[None]:
    """Bind context to every log line in this task (and tasks it spawns) for
    the duration of the block; None values are not bound."""
    values = dict(journal=journal, route=route, fragment=fragment, revision=revision, **extra)
    tokens = bind_contextvars(**{k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        reset_contextvars(**tokens)
