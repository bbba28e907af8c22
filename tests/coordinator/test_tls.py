"""TLS on coordinator sockets (mTLS between peers): a plain-TCP client is refused, a TLS
client works, and an R=2 journal replicates over TLS between the two coordinators."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from protocol import ProtocolError, Status
from protocol.messages import Hello, HelloAck
from protocol.stream import FrameStream
from protocol.tls import client_context
from tools.services import etcd_prefix
from tools.tls_certs import make_local_ca

from .cluster import Cluster, Conn, make_workdir, spec, wait_appendable

pytestmark = pytest.mark.timeout(120)


def test_tls_coordinators(etcd) -> None:  # noqa: ANN001
    with etcd_prefix(etcd, "tls-coordinators") as root:
        c = Cluster(etcd.url, root, make_workdir())
        ca = make_local_ca(os.path.join(c.workdir, "tls"))
        c.ssl = client_context(ca.ca, ca.cert, ca.key)
        c.extra = ["--tls-cert", ca.cert, "--tls-key", ca.key, "--tls-ca", ca.ca, "--tls-client-auth"]
        for i in range(2):
            c.add(f"zone-{i}", f"node-{i}")
        for n in c.nodes:
            c.start(n)
        try:
            asyncio.run(_exercise(c, ca))
        finally:
            c.stop_all()
            shutil.rmtree(c.workdir, ignore_errors=True)


async def _exercise(c: Cluster, ca) -> None:  # noqa: ANN001
    from quire.client import Client

    for n in c.nodes:
        await c.wait_listening(n)
    ep = c.nodes[0].endpoint
    # Plain TCP: the TLS handshake fails and the connection is closed, never served.
    s = await FrameStream.connect(ep, timeout=5.0)
    with pytest.raises((ProtocolError, OSError, asyncio.TimeoutError)):
        await s.send(Hello())
        await asyncio.wait_for(s.read_message(HelloAck), 10)
    s.abort()
    # TLS without a client certificate: refused too (the coordinators require mTLS).
    with pytest.raises((ProtocolError, OSError, asyncio.TimeoutError)):
        s = await FrameStream.connect(ep, timeout=5.0, ssl=client_context(ca.ca))
        await s.send(Hello())
        await asyncio.wait_for(s.read_message(HelloAck), 10)
    # A TLS client with a certificate works; R=2 means the primary's pipeline to its peer
    # is TLS with the coordinator's own certificate.
    conn = await Conn.open(ep, ssl=c.ssl)
    assert (await conn.apply(spec("tls/events", replication=2))).status == Status.OK
    await conn.close()
    assert (await wait_appendable(ep, "tls/events", ssl=c.ssl)).status == Status.OK
    async with Client([n.endpoint for n in c.nodes], ssl=c.ssl, retry_timeout=20) as client:
        res = await client.append("tls/events", b"over TLS\n")
        for n in c.nodes:
            async with Client([n.endpoint], ssl=c.ssl) as reader:
                out = bytearray()
                async for _, data in reader.read("tls/events", 0, end_offset=res.commit.end):
                    out += data
                assert bytes(out).endswith(b"over TLS\n")
