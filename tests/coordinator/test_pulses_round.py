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


ROUTE_B = Route(members=(ProcessId("zone-a", "node-0"), ProcessId("zone-b", "node-1")), primary=0)


async def test_a_route_wanted_while_its_journal_pulses_is_pulsed_after_it() -> None:
    """A member joins a journal's route while the pulse of the route before is running:
    `want(route B)` then found the journal running and was dropped, the running pulse
    settled on route A, and B was not pulsed (nor advertised) until the next periodic
    round — a 10,000-journal cluster's last routes waited up to a pulse interval (60 s)
    for exactly that. Now the journal is handed back to Hosting when the pulse ends, and
    its re-evaluation pulses B; in the periodic round too."""
    server = SimpleNamespace(replicas={"j/a": None, "j/b": None})
    changed: list[str] = []
    tasks: list[asyncio.Task] = []
    gate = asyncio.Event()
    pulsed: list[str] = []

    def resolve_now(journal: str) -> SimpleNamespace:
        return SimpleNamespace(is_primary=True, route=ROUTE)

    def spawn(coro, name: str) -> None:  # noqa: ANN001
        tasks.append(asyncio.ensure_future(coro))

    pulses = Pulses(server, resolve_now, spawn, changed.append, interval=60.0)

    async def pulse(journal: str) -> SimpleNamespace:
        pulsed.append(journal)
        await gate.wait()
        return SimpleNamespace(state=State.FINISHED, status=Status.OK, message="")

    pulses.pulse = pulse  # type: ignore[method-assign]

    # A one-shot pulse of route A is running; route B is wanted meanwhile.
    pulses.want("j/a", ROUTE)
    await asyncio.sleep(0)
    pulses.want("j/a", ROUTE_B)
    assert len(tasks) == 1 and changed == []
    gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert changed == ["j/a"]  # handed back: Hosting re-evaluates it
    pulses.want("j/a", ROUTE_B)  # (what that re-evaluation does)
    assert len(tasks) == 2
    await asyncio.wait_for(tasks[1], 5)
    assert pulsed == ["j/a", "j/a"] and changed == ["j/a"]

    # The periodic round: j/b's route changes while the round pulses it.
    gate.clear()
    round_ = asyncio.ensure_future(pulses.round())
    while "j/b" not in pulsed:
        await asyncio.sleep(0)
    pulses.want("j/b", ROUTE_B)
    assert len(tasks) == 2  # not started twice
    gate.set()
    await asyncio.wait_for(round_, 5)
    assert changed == ["j/a", "j/b"]
    # Nothing was asked again: a synced want (the round synced what resolve_now says)
    # starts nothing and hands nothing back.
    pulses.want("j/a", ROUTE)
    assert len(tasks) == 2 and changed == ["j/a", "j/b"]
