"""The quire coordinator: the broker server that hosts journal replicas.

Topology (etcd) modules, one concept each:

- `etcd`           connection helper, the key layout, transaction helpers, typed errors
- `keyspace`       a local mirror of `<root>/` kept current by a watch
- `specs`          Apply / List of journal specs
- `membership`     a member's lease-bound announcement (`BrokerSpec`)
- `allocator_plan` pure placement and safe-transition planning
- `allocator`      leader election and the etcd adapter that applies plans
- `resolver`       journal -> route / primary / header at a revision
- `assignments`    routes built from assignments; advertising consistency
- `topology_member` a runnable member (membership + allocator) for tests

This package docstring imports nothing on purpose: importing `coordinator` must stay
cheap and free of side effects for the CLI's entry-point discovery.
"""
