"""A tiny asyncio HTTP/1.1 server for the live dashboard (stdlib only).

Routes: `GET /` (the page), `/app.js`, `/style.css`, `/api/state` (JSON snapshot),
`/healthz`, and `/login?token=…` when auth is on. HTTPS when given an SSL context (TLS on:
the cluster's certificate, QUIRE_TLS_CERT / QUIRE_TLS_KEY) (access.py: `/api/state` then needs a
token with LIST and shows only its journals). One request per connection (`Connection: close`), GET and HEAD only,
request heads capped at 16 KiB: it serves a handful of operators' browsers, not traffic.
"""

from __future__ import annotations

import asyncio
import json
from email.utils import formatdate
from ssl import SSLContext
from importlib import resources
from typing import Any

import structlog

from protocol.auth import Keyring

from .access import Denied, login, request_token, require, visible_state
from .state import StateCollector

__all__ = ["DashboardServer"]

log = structlog.get_logger()

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
_REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error"}
MAX_HEAD = 16 * 1024
READ_TIMEOUT = 10.0


def _static(name: str) -> bytes:
    try:
        return resources.files("dashboards").joinpath("static", name).read_bytes()
    except FileNotFoundError:
        raise RuntimeError(f"dashboards/static/{name} is missing from this installation "
                           "(install from a source tree, or ship dashboards/static as package data)") from None


class DashboardServer:
    def __init__(self, collector: StateCollector, host: str = "127.0.0.1", port: int = 8090,
                 keyring: Keyring | None = None, ssl: SSLContext | None = None) -> None:
        self.collector = collector
        self.ssl = ssl
        """Serve HTTPS with this context (the cluster's certificate when TLS is on)."""
        self.keyring = keyring
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._files = {path: (_static(name), ctype) for path, (name, ctype) in _STATIC.items()}

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port,
                                                  limit=MAX_HEAD, ssl=self.ssl,
                                                  ssl_handshake_timeout=READ_TIMEOUT
                                                  if self.ssl is not None else None)
        self.port = self._server.sockets[0].getsockname()[1]
        scheme = "https" if self.ssl is not None else "http"
        log.info("dashboard listening", url=f"{scheme}://{self.host}:{self.port}/",
                 etcd=self.collector.etcd_url, root=self.collector.root)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            await self.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await self.collector.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, ctype, body, head_only, *extra = await self._respond(reader)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
            log.warning("dashboard request failed", error=repr(exc))
            status, ctype, body, head_only, extra = 500, "text/plain", b"internal error\n", False, []
        headers = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
                   f"Date: {formatdate(usegmt=True)}",
                   f"Content-Type: {ctype}",
                   f"Content-Length: {len(body)}",
                   "Cache-Control: no-store",
                   "X-Content-Type-Options: nosniff",
                   *extra,
                   "Connection: close", "", ""]
        try:
            writer.write("\r\n".join(headers).encode("latin-1"))
            if not head_only:
                writer.write(body)
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except (TimeoutError, OSError):
            pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def _respond(self, reader: asyncio.StreamReader) -> tuple:
        """(status, content type, body, head only, extra header lines…)."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        except TimeoutError:
            return _text(408, "request timeout")
        except asyncio.LimitOverrunError:
            return _text(431, "request head too large")
        except asyncio.IncompleteReadError:
            return _text(400, "incomplete request")
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _text(400, "bad request line")
        method, target, _ = parts
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _text(405, "only GET and HEAD")
        head_only = method == "HEAD"
        if path in self._files:
            body, ctype = self._files[path]
            return 200, ctype, body, head_only
        if path == "/api/state":
            claims = None
            if self.keyring is not None:
                try:
                    claims = require(self.keyring, request_token(head))
                except Denied as exc:
                    return _text(exc.status, str(exc))
            state = await self.collector.snapshot()
            if claims is not None:
                state = visible_state(state, claims)
            return 200, "application/json", _json(state), head_only
        if path == "/login" and self.keyring is not None:
            try:
                cookie = login(self.keyring, target)
            except Denied as exc:
                return _text(exc.status, str(exc))
            return (303, "text/plain; charset=utf-8", b"logged in\n", head_only,
                    "Location: /", f"Set-Cookie: {cookie}")
        if path == "/healthz":
            return 200, "text/plain; charset=utf-8", b"ok\n", head_only
        return _text(404, "not found")


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _text(status: int, message: str) -> tuple[int, str, bytes, bool]:
    return status, "text/plain; charset=utf-8", (message + "\n").encode(), False
