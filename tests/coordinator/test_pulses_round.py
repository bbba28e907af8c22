"""The periodic pulse round runs in one task, not one task per journal (#49).

A coordinator leading thousands of idle journals used to spawn a task per journal
every pulse interval. The round now pulses them with PULSE_CONCURRENCY pulsers of its
own; only a journal whose pulse did not sync goes to the retrying per-journal kind.
Pure: the pulse itself (an append FSM) is replaced by a stand-in.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from coordinator.append_fsm import State
from coordinator.pulses import PULSE_CONCURRENCY, Pulses
from protocol import ProcessId, Route, Status

ROUTE = Route(members=(ProcessId("zone-a", "node-0"),), primary=0)


async def test_a_round_pulses_every_led_journal_without_a_task_each() -> None:
    names = [f"j/{i:04d}" for i in range(600)]
    server = SimpleNamespace(replicas={n: None for n in names})
    led = set(names[:500])  # the rest are replicas only
    spawned: list[str] = []
    in_flight = peak = 0
    pulsed: list[str] = []

    def resolve_now(journal: str) -> SimpleNamespace:
        return SimpleNamespace(is_primary=journal in led, route=ROUTE)

    def spawn(coro, name: str) -> None:  # noqa: ANN001
        spawned.append(name)
        coro.close()

    pulses = Pulses(server, resolve_now, spawn, lambda _j: None, interval=60.0)

    async def pulse(journal: str) -> SimpleNamespace:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        pulsed.append(journal)
        ok = journal != "j/0007"  # one pulse fails: retried by its own task
        return SimpleNamespace(state=State.FINISHED if ok else State.ERROR,
                               status=Status.OK if ok else Status.UNAVAILABLE, message="")

    pulses.pulse = pulse  # type: ignore[method-assign]
    tasks_before = len(asyncio.all_tasks())
    await asyncio.wait_for(pulses.round(), 10)
    assert sorted(pulsed) == sorted(led)
    assert 1 < peak <= PULSE_CONCURRENCY
    assert spawned == ["pulse:j/0007"]  # only the one that did not sync
    assert len(asyncio.all_tasks()) <= tasks_before
    # Synced journals are remembered: `want` on the same route pulses nothing.
    pulses.want("j/0001", ROUTE)
    assert spawned == ["pulse:j/0007"]
