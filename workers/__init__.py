"""Celery role (layer 4): fragment persistence, index refresh and pulse tasks.

    app        the Celery app, queues and beat schedule     persist   fetch, compress, upload
    index      list the store, publish the covering set     pulse     zero-byte appends
    fetch      fragment bytes from a replica over the wire  topology  journals from etcd

May import protocol, fragment_store and quire (the client); never another role — the
coordinator enqueues our tasks by name, and we reach it only over the wire.
"""
