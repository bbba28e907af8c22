"""Structured logging for every quire process.

structlog is wired to the standard library at import, so a logger obtained
before `configure_logging()` runs (a module-level `log = get_logger(...)`)
still ends up in the handler installed later. `configure_logging()` only
installs that one root handler, whose formatter renders JSON or console
output; stdlib loggers (Celery, kombu, asyncio) go through the same renderer
and carry the same bound context.

With `count_errors`, every event at ERROR or above (ours, and the stdlib loggers': asyncio
logs there an exception that escaped a handler or a task) also counts in
`quire_log_errors_total` of the process's Prometheus registry, so an error that
only went to a log file still raises an alert (dashboards/alerts.yml, QuireErrorsLogged).
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
    stacking a second one (which would print every line twice); with `count_errors`,
    every record at ERROR or above also counts in quire_log_errors_total."""

    count_errors = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.count_errors and record.levelno >= logging.ERROR:
            try:
                error_counter().inc()
            except Exception:  # noqa: BLE001 - counting must never lose the line itself
                pass
        super().emit(record)


_error_counter: Any = None


def error_counter() -> Any:
    """The process's quire_log_errors_total (registered at the first call: at
    `configure_logging(count_errors=True)`, so its series is scraped at 0 before the first
    error and an `increase()` sees that one too)."""
    global _error_counter
    if _error_counter is None:
        from prometheus_client import Counter

        _error_counter = Counter("quire_log_errors_total",
                                 "Events this process logged at ERROR or above (an exception "
                                 "caught where none was expected, a lost lease, a refusing "
                                 "spool): its log says which and why")
    return _error_counter


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
    count_errors: bool = False,
) -> None:
    """Route all logging to `stream` (default stdout) as JSON or console text;
    `count_errors`: also count ERROR events in quire_log_errors_total (module docstring).

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
    if count_errors:
        error_counter()  # (registered now: scraped at 0 before the first error)
        handler.count_errors = True

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
