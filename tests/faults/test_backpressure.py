"""The unpersisted-bytes bound (`--max-unpersisted`) as backpressure: with nothing
persisting (no store reachable: these coordinators keep every closed fragment locally),
a member that holds more than its bound of unpersisted content refuses appends with
SPOOL_FULL naming itself and the bound — a clear status instead of a full disk — while
reads go on and nothing acknowledged is lost."""

from __future__ import annotations

from protocol import Status

from .harness import Model, alive, append, append_until, check, cluster_on, read_ids, route, serve

BOUND = 512 << 10
RECORD = 16 << 10


async def test_the_unpersisted_bound_turns_into_backpressure(etcd, etcd_root, tmp_path) -> None:  # noqa: ANN001
    dirs = [str(tmp_path / f"spool-{i}") for i in range(3)]
    with cluster_on(etcd.url, etcd_root, dirs, extra=["--max-unpersisted", str(BOUND)]) as c:
        await serve(c, length=64 << 10)
        model = Model()
        primary, _ = await route(c)
        await append_until(c, model, RECORD, {Status.SPOOL_FULL}, timeout=60.0, via=primary)
        status, message = model.errors[-1]
        assert "not yet persisted" in message and str(BOUND) in message, message
        assert "member zone-" in message, message
        # Held bytes never shrink here (nothing persists): it keeps refusing, cleanly.
        for _ in range(3):
            assert await append(c, model, RECORD, via=primary) == Status.SPOOL_FULL
        assert len(model.acked) * RECORD >= BOUND - 2 * (64 << 10), len(model.acked)
        assert not model.unknown, model.errors
        alive(c)
        check(model, await read_ids(c, via=primary))
