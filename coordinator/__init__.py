"""The quire coordinator: the broker server that hosts journal replicas.

- `server`, `host`, `hosting`, `drain`   connections; what is hosted; the etcd side; exit
- `append_fsm`, `append_rules`, `append_sync`, `append_api`   the seed's append machine
- `pipeline`, `replicate_api`, `replicate_mux`, `replica`, `spool`, `spool_files`
  replication (one multiplexed connection per peer) and spools
- `read_api`, `read_relay`, `held_copies`, `persister`, `index_watch`, `recovery`, `fence`,
  `suspend`, `flow_control`
- `specs`          Apply / List of journal specs
- `resolver`       journal -> route / primary / header at a revision

The etcd machinery it shares with the consumers (keyspace, membership, allocator) is
in `topology/`, one layer down.

Layer 4 (a role): imports protocol, fragment_store, quire and topology only, never
another role (it enqueues worker tasks by name). The server stacks up without circles:
host (what is hosted) <- hosting (etcd side), drain <- server (connections).

This package imports nothing but `protocol.native` on purpose: importing `coordinator`
must stay cheap and free of side effects for the CLI's entry-point discovery, and the
choice between the compiled and the pure hot path (protocol/native.py) must be made
before any coordinator module is imported.
"""

import protocol.native  # noqa: F401 - selects the compiled or the pure hot path first
