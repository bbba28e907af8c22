"""Stream a closed fragment's raw bytes from a replica (FetchFragment RPC).

Blocking sockets, because the consumer (a store upload inside a Celery task) is
blocking: the generator yields chunks as they arrive, so a fragment is never held
in memory whole. Every socket operation has a timeout.

Endpoints are tried in order. If one fails mid-stream, the next one is asked for
the same fragment and the bytes already yielded are skipped: content is
addressed by SHA-1, so every replica serves the same bytes, and the consumer sees
one seamless stream (the store verifies the sum at the end).

    Hello -> HelloAck
    FetchFragmentRequest -> FetchFragmentResponse, FragmentContent*, FragmentContent(b"")
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from collections.abc import Iterator, Sequence

from protocol.logs import get_logger
from protocol import (
    ErrorFrame,
    FetchFragmentRequest,
    FetchFragmentResponse,
    Fragment,
    FragmentContent,
    Hello,
    HelloAck,
    Message,
    ProtocolError,
    Status,
)
from protocol.credentials import TokenSource, current_token
from protocol.wire import PREFIX_SIZE, check_prefix, decode_header, encode_frame_bytes
from workers.errors import FragmentNotLocal, ReplicaUnavailable

__all__ = ["fetch_fragment", "Throttle"]

log = get_logger(__name__)


class Throttle:
    """Caps a byte rate by sleeping; rate 0 disables it."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.total = 0

    def add(self, n: int) -> None:
        if self.rate <= 0:
            return
        self.total += n
        ahead = self.total / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


@functools.lru_cache(maxsize=1)
def _security() -> tuple[TokenSource, ssl.SSLContext | None]:
    """The token (QUIRE_TOKEN or QUIRE_TOKEN_FILE: READ on the journals persisted) and
    TLS context (QUIRE_TLS_CA) this worker presents to coordinators; docs/security.md."""
    from protocol.credentials import settings_token
    from protocol.config import load_settings
    from protocol.tls import settings_client_ssl

    s = load_settings()
    return settings_token(s), settings_client_ssl(s)


class _Conn:
    def __init__(self, endpoint: str, timeout: float) -> None:
        host, _, port = endpoint.rpartition(":")
        self.sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
        ctx = _security()[1]
        if ctx is not None:
            self.sock = ctx.wrap_socket(self.sock, server_hostname=host or "127.0.0.1")
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ConnectionError("connection closed by peer")
            got += k
        return bytes(buf)

    def read(self) -> tuple[Message, bytes]:
        kind, hlen, plen = check_prefix(self._exactly(PREFIX_SIZE))
        body = self._exactly(hlen + plen)
        message = decode_header(kind, body[:hlen])
        if isinstance(message, ErrorFrame):
            raise ProtocolError(f"peer error {message.status.name}: {message.message}")
        return message, body[hlen:]

    def send(self, message: Message) -> None:
        self.sock.sendall(encode_frame_bytes(message))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _expect(message: Message, cls: type[Message]) -> None:
    if not isinstance(message, cls):
        raise ProtocolError(f"expected {cls.__name__}, got {type(message).__name__}")


def _stream_one(endpoint: str, fragment: Fragment, skip: int, timeout: float,
                throttle: Throttle) -> Iterator[bytes]:
    conn = _Conn(endpoint, timeout)
    try:
        conn.send(Hello(token=current_token(_security()[0])))
        ack, _ = conn.read()
        _expect(ack, HelloAck)
        conn.send(FetchFragmentRequest(fragment=fragment))
        resp, _ = conn.read()
        _expect(resp, FetchFragmentResponse)
        assert isinstance(resp, FetchFragmentResponse)
        if resp.status != Status.OK:
            raise FragmentNotLocal(f"{endpoint}: {resp.status.name} {resp.message}".strip())
        while True:
            msg, payload = conn.read()
            _expect(msg, FragmentContent)
            if not payload:
                return
            throttle.add(len(payload))
            if skip >= len(payload):
                skip -= len(payload)
                continue
            if skip:
                payload, skip = payload[skip:], 0
            yield payload
    finally:
        conn.close()


def fetch_fragment(endpoints: Sequence[str], fragment: Fragment, *, timeout: float = 30.0,
                   read_rate: int = 0) -> Iterator[bytes]:
    """Yield the fragment's raw content, exactly `fragment.content_length` bytes.

    Raises FragmentNotLocal if every endpoint answered without the fragment,
    ReplicaUnavailable if none could be read to the end.
    """
    if not endpoints:
        raise ReplicaUnavailable(f"no replica endpoint given for {fragment.journal}")
    sent = 0
    throttle = Throttle(read_rate)
    errors: list[str] = []
    not_local = 0
    for endpoint in endpoints:
        try:
            for chunk in _stream_one(endpoint, fragment, sent, timeout, throttle):
                sent += len(chunk)
                if sent > fragment.content_length:
                    raise ProtocolError(f"{endpoint} sent more than {fragment.content_length} bytes")
                yield chunk
        except FragmentNotLocal as exc:
            not_local += 1
            errors.append(str(exc))
            continue
        except (OSError, ProtocolError) as exc:
            errors.append(f"{endpoint}: {type(exc).__name__}: {exc}")
            log.warning("fragment fetch failed; trying the next replica", endpoint=endpoint,
                        fetched=sent, error=str(exc))
            continue
        if sent != fragment.content_length:
            errors.append(f"{endpoint}: stream ended at {sent} of {fragment.content_length} bytes")
            continue
        return
    if not_local == len(endpoints):
        raise FragmentNotLocal("no replica holds the fragment: " + "; ".join(errors))
    raise ReplicaUnavailable("could not fetch the fragment: " + "; ".join(errors))
