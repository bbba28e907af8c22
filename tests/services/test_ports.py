"""Ports the fixtures hand out: never from the kernel's ephemeral range (which every
outgoing connection draws from) and never the same across pytest-xdist workers."""

from __future__ import annotations

import socket

from tools.services.process import _ephemeral_low, free_port, port_block


def test_each_xdist_worker_has_its_own_block_below_the_ephemeral_range() -> None:
    blocks = [port_block({"PYTEST_XDIST_WORKER": f"gw{n}", "PYTEST_XDIST_WORKER_COUNT": "4"})
              for n in range(4)]
    for i, a in enumerate(blocks):
        assert len(a) > 1000 and a.stop <= _ephemeral_low()
        for b in blocks[i + 1:]:
            assert a.stop <= b.start or b.stop <= a.start  # disjoint
    alone = port_block({})
    assert alone.start >= 1024 and alone.stop == max(alone.start + 1000, _ephemeral_low())


def test_free_ports_are_bindable_distinct_and_in_the_block() -> None:
    block = port_block()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50 and all(p in block for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # still free: nothing took it
