"""The tools that assemble a cluster or a run (layer 5, the top).

    tools.cli            the `quire` command (role commands join it through entry points)
    tools.local_cluster  `quire up`: etcd, Redis, coordinators, workers, beat, dashboard
    tools.services       launchers of the real services (etcd, redis-server, S3, Celery)
    tools.demo           `make run`: the whole system end to end, then stop
    tools.layers         the import graph of the tree: the layer check and its picture

May import every layer below (protocol, fragment_store, quire, and roles only by name:
roles are started as subprocesses or joined through entry points, never imported).
"""
