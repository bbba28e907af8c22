"""AppendRequest.roll_below: a zero-byte append that asks the primary to close its open
fragment when it holds bytes below the offset (the jobs scheduler's roll, docs/jobs.md),
through a real coordinator — directly and proxied by a member that is not the primary."""

from __future__ import annotations

from coordinator.append_stream import roll_asked
from quire.client import Client

from .cluster import running, serve_journal

J = "roll/below"


def test_roll_asked_only_for_an_open_fragment_below_the_offset() -> None:
    assert roll_asked(50, begin=0, content_length=100)
    assert not roll_asked(0, begin=0, content_length=100)  # not asked
    assert not roll_asked(100, begin=100, content_length=10)  # begins at the offset already
    assert not roll_asked(150, begin=100, content_length=0)  # an empty spool never rolls


async def _spans(client: Client) -> list[tuple[int, int]]:
    return sorted((f.spec.begin, f.spec.end) for f in await client.list_fragments(J))


async def test_a_zero_byte_append_with_roll_below_closes_the_open_fragment(etcd, etcd_root) -> None:  # noqa: ANN001
    with running(etcd.url, etcd_root, 2) as c:
        await serve_journal(c, J, replication=1)
        for node in c.nodes:  # once directly to the primary, once proxied by the other
            client = Client([node.endpoint], retry_timeout=30)
            try:
                head = (await client.append(J, b"x" * 100)).end
                await client.append(J, b"", roll_below=head - 50)
                await client.append(J, b"y" * 10)
                spans = await _spans(client)
                # Closed at the head it had reached; the next bytes open a new fragment.
                assert spans[-2][1] == head and spans[-1] == (head, head + 10), spans
                # The open fragment begins at the offset already: nothing to close.
                await client.append(J, b"", roll_below=head)
                await client.append(J, b"z" * 5)
                assert (await _spans(client))[-1] == (head, head + 15)
            finally:
                await client.close()
