"""Log output shape: JSON lines with context, stdlib loggers included."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from protocol.logs import bind, configure_logging, get_logger


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    # Leave the root logger as pytest's own capture expects it.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def json_stream() -> io.StringIO:
    buf = io.StringIO()  # not a TTY, so "auto" means JSON
    configure_logging("auto", "INFO", stream=buf)
    return buf


def lines(buf: io.StringIO) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_json_shape_and_bound_context(json_stream: io.StringIO) -> None:
    log = get_logger("quire.test")
    with bind(journal="a/b", revision=42, route=None):
        log.info("appended", bytes=10)
    log.info("outside")
    first, second = lines(json_stream)
    assert first["event"] == "appended" and first["bytes"] == 10
    assert first["level"] == "info" and first["logger"] == "quire.test"
    assert first["journal"] == "a/b" and first["revision"] == 42
    assert "route" not in first  # None values are not bound
    assert first["timestamp"].endswith("Z")
    assert "journal" not in second  # context ends with the block


def test_stdlib_loggers_render_the_same_way(json_stream: io.StringIO) -> None:
    with bind(fragment="0-10-abc"):
        logging.getLogger("celery.worker").warning("lost %d workers", 2)
    (line,) = lines(json_stream)
    assert line == {
        "event": "lost 2 workers",
        "level": "warning",
        "logger": "celery.worker",
        "fragment": "0-10-abc",
        "timestamp": line["timestamp"],
    }


def test_exceptions_are_structured(json_stream: io.StringIO) -> None:
    try:
        raise KeyError("j1")
    except KeyError:
        get_logger("quire.test").exception("failed")
    (line,) = lines(json_stream)
    assert line["level"] == "error"
    assert line["exception"][0]["exc_type"] == "KeyError"


def test_level_filter_and_idempotence(json_stream: io.StringIO) -> None:
    configure_logging("json", "WARNING", stream=json_stream)
    log = get_logger("quire.test")
    log.info("dropped")
    log.warning("kept")
    assert [line["event"] for line in lines(json_stream)] == ["kept"]  # once, not twice


def test_console_format_and_bad_format() -> None:
    buf = io.StringIO()
    configure_logging("console", "INFO", stream=buf)
    get_logger("quire.test").info("hello", journal="x")
    out = buf.getvalue()
    assert "hello" in out and "journal=x" in out and not out.startswith("{")
    with pytest.raises(ValueError, match="auto|json|console"):
        configure_logging("xml")


def test_errors_are_counted_when_asked_ours_and_the_stdlib_loggers() -> None:
    """`count_errors`: every event at ERROR or above — a structlog error, a caught
    exception, asyncio's own (an exception that escaped a handler) — counts once in
    quire_log_errors_total (QuireErrorsLogged); warnings do not, and without the flag
    nothing counts."""
    from protocol.logs import error_counter

    counter = error_counter()
    before = counter._value.get()
    buf = io.StringIO()
    configure_logging("json", "INFO", stream=buf)
    get_logger("quire.test").error("not counted: the process did not ask")
    configure_logging("json", "INFO", stream=buf, count_errors=True)
    log = get_logger("quire.test")
    log.warning("a warning")
    log.error("an error")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("caught")
    logging.getLogger("asyncio").error("frame connection handler failed")
    assert counter._value.get() - before == 3
    assert [e["level"] for e in lines(buf)][-4:] == ["warning", "error", "error", "error"]
