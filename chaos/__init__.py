"""Fault injection for quire (`quire chaos`).

    schedule.py   seeded fault schedule (pure)
    proxy.py      fault-injecting asyncio TCP proxy, one per link
    cluster.py    etcd, redis, S3, a Celery worker and N coordinators as subprocesses
    nemesis.py    plays the schedule: kill -9 / restart, SIGSTOP / SIGCONT, proxy modes
    history.py    self-checking records and the invoke/ok/fail/info history
    readback.py   final read, per-replica reads, persisted fragments
    checker.py    history + read-back -> anomaly counts (pure)
    runner.py     one run, start to finish
    main.py       the `quire chaos` command

Layer 5 (a tool): imports `protocol`, `fragment_store`, `quire.client` and
`tools.services`, never `coordinator`/`workers`/`spark`, which it drives as
subprocesses. `bench` reuses `chaos.cluster` to start its cluster.
"""
