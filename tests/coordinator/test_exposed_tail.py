"""A primary's unacknowledged tail that one of its sync proposals carried is part of
the journal: never dropped as unacknowledged afterwards.

Chaos campaign seed 13 (docs/reliability.md): a primary committed an append to its own
spool, lost its peers before their acknowledgements (COMMIT_UNKNOWN), then started a new
pipeline whose sync proposal carried that end; the peers behind it rolled forward past
it on receipt — without its bytes, adopting the producer table that recorded the
transaction — and when the primary lost its route a moment later it dropped the tail as
unacknowledged. The writer's re-send was then answered OK with the original offsets,
which no member held any longer: an acknowledged append lost."""

from __future__ import annotations

from coordinator.replica import Replica
from coordinator.spool import MemoryFiles

J = "exposed/j"


def primary_commit(replica: Replica, data: bytes) -> None:
    spool = replica.spool
    spool.apply_content(spool.delta, data)
    spool.apply_proposal(spool.commit_proposal(), primary=True, epoch=7)


def test_an_exposed_tail_survives_and_a_later_unacknowledged_one_does_not() -> None:
    replica = Replica(J, MemoryFiles())
    primary_commit(replica, b"acknowledged ")
    replica.publish(replica.spool.end)  # every peer acknowledged
    primary_commit(replica, b"unknown outcome ")  # COMMIT_UNKNOWN: not published
    exposed = replica.spool.end
    replica.expose(exposed)  # the next pipeline's sync proposal carried it
    primary_commit(replica, b"never proposed in a sync")  # failed too, not exposed

    replica.drop_unacknowledged()  # the route went away, or another stream takes it
    assert replica.spool.end == exposed
    assert replica.spool.read_committed(0, exposed) == b"acknowledged unknown outcome "


def test_without_a_sync_proposal_the_unacknowledged_tail_is_dropped() -> None:
    replica = Replica(J, MemoryFiles())
    primary_commit(replica, b"acknowledged ")
    replica.publish(replica.spool.end)
    primary_commit(replica, b"unknown outcome ")
    replica.drop_unacknowledged()
    assert replica.spool.end == len(b"acknowledged ")
