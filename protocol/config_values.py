"""The value parsers of quire's settings (config.py): each takes a value from a flag, the
environment or a YAML file and returns it typed, or raises ValueError naming what was
expected (config.py adds where the value came from)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class Secret:
    """A string that does not print. `reveal()` is the only way to read it, so a
    settings object can be logged, repr'd or put in an exception safely."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)



def text(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError("expected a string")
    return str(value).strip()


def http_url(value: Any) -> str:
    s = text(value)
    u = urlsplit(s)
    try:
        ok = u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 1) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError("expected an http(s) URL like http://127.0.0.1:2379")
    return s.rstrip("/")


def http_urls(value: Any) -> str:
    """One http(s) URL, or several comma-separated with one scheme (an etcd cluster)."""
    parts = [p.strip() for p in text(value).split(",") if p.strip()]
    if not parts:
        raise ValueError("expected an http(s) URL like http://127.0.0.1:2379")
    try:
        urls = [http_url(p) for p in parts]
    except ValueError:
        raise ValueError("expected http(s) URLs like http://etcd-a:2379,http://etcd-b:2379"
                         if len(parts) > 1 else "expected an http(s) URL like http://127.0.0.1:2379"
                         ) from None
    if len({u.split("://")[0] for u in urls}) > 1:
        raise ValueError("expected one scheme for every URL, not both http:// and https://")
    return ",".join(urls)


def etcd_root(value: Any) -> str:
    s = text(value).rstrip("/")
    if not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", s):
        raise ValueError("expected an absolute key prefix like /quire")
    return s


def redis_url(value: Any) -> str:
    s = text(value)
    if urlsplit(s).scheme not in ("redis", "rediss", "unix"):
        raise ValueError("expected a URL like redis://127.0.0.1:6379/0")
    return s


def store_url(value: Any) -> str:
    s = text(value)
    u = urlsplit(s)
    if u.scheme == "file" and u.path.startswith("/") and not u.netloc:
        return s if s.endswith("/") else s + "/"
    if u.scheme == "s3" and re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", u.netloc or ""):
        return s if s.endswith("/") else s + "/"
    raise ValueError("expected file:///absolute/dir/ or s3://bucket/prefix/")


def brokers(value: Any) -> str:
    parts = [p.strip() for p in text(value).split(",") if p.strip()]
    if not parts:
        raise ValueError("expected host:port[,host:port...] like 127.0.0.1:8080")
    for part in parts:
        try:
            hostport(part)
        except ValueError:
            raise ValueError("expected host:port[,host:port...] like 127.0.0.1:8080") from None
    return ",".join(parts)


def endpoint(value: Any) -> str:
    s = text(value)
    expected = "expected host:port or an http(s) URL like http://127.0.0.1:9000"
    if "://" in s:
        try:
            return http_url(s)
        except ValueError:
            raise ValueError(expected) from None
    if re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", s):
        return s
    raise ValueError(expected)


def secret(value: Any) -> Secret:
    if isinstance(value, Secret):
        return value
    s = text(value)
    if not s:
        raise ValueError("expected a non-empty string")
    return Secret(s)


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = text(value).lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def directory(value: Any) -> str:
    s = text(value)
    if not s:
        raise ValueError("expected a directory path")
    return str(Path(s).expanduser().absolute())


def file(value: Any) -> str:
    s = text(value)
    if not s:
        raise ValueError("expected a file path")
    return str(Path(s).expanduser().absolute())


def token(value: Any) -> str:
    s = text(value)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", s):
        raise ValueError("expected a name of letters, digits, '.', '_' or '-'")
    return s


def hostport(value: Any) -> str:
    s = text(value)
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError("expected host:port like 127.0.0.1:8080")
    return s


def integer(minimum: int, expected: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(expected)
        try:
            n = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError(expected) from None
        if n < minimum:
            raise ValueError(expected)
        return n

    return parse


def choice(*choices: str, upper: bool = False) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        s = text(value)
        s = s.upper() if upper else s.lower()
        if s not in choices:
            raise ValueError("expected one of " + "|".join(choices))
        return s

    return parse
