"""Fault injection for quire (`quire chaos`).

    schedule.py   seeded fault schedule (pure)
    proxy.py      fault-injecting asyncio TCP proxy, one per link
    cluster.py    etcd, redis, S3, a Celery worker and N coordinators as subprocesses
    nemesis.py    plays the schedule: kill -9 / restart, SIGSTOP / SIGCONT, proxy modes
    history.py    self-checking records and the invoke/ok/fail/info history
    writers.py    the writers and tail readers (and their proxied, traced client)
    consumer_group.py  a consumer group (count shards) over its own sources: setup,
                  event writers, an etcd watch of primaries, the final read-back
    consumer_check.py  committed consumer state vs a model of the input (pure)
    readback.py   final read, per-replica reads, persisted fragments
    checker.py    history + read-back -> anomaly counts (pure)
    runner.py     one run, start to finish
    main.py       the `quire chaos` command

Layer 5 (a tool): imports `protocol`, `fragment_store`, `quire.client`, `topology`,
`tools.services` and, for the recovery-log record format and store keys only,
`consumers`; never `coordinator`/`workers`/`spark`, which it drives as subprocesses
(consumer members too). `bench` reuses `chaos.cluster` to start its cluster.
"""
