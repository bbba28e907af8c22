"""The cluster's shape in etcd (layer 3, beside the client): shared by every role
that holds work under a lease — coordinators hold journals, consumer members hold shards.

- `etcd`            connection helper, the key layout, transaction helpers, typed errors
- `keyspace`        a local mirror of `<root>/` kept current by a watch
- `membership`      a member's lease-bound announcement (`BrokerSpec`)
- `allocator_plan`  pure placement and safe-transition planning (rendezvous, zones)
- `allocator`       leader election and the etcd adapter that applies plans
- `assignments`     routes built from assignments; advertising consistency
- `topology_member` a runnable member (membership + allocator) for tests

Imports protocol (and aetcd) only; never fragment_store, the client, a role or a tool.
"""
