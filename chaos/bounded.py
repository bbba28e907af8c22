"""Bounded waits for the harness: nothing after the write phase may wait forever.

A chaos run ends with a string of waits on things the faults may have broken: the
nemesis's last fault, the tail readers, healing (processes resumed and restarted), the
barriers, the read-back, the consumers' catch-up, then the clean-up (members stopped,
the faulty disks unmounted). Each used to be bounded by `asyncio.wait_for` at best,
which on its timeout *cancels and then waits, without a bound, for the cancellation to
finish* (Python 3.11): a task that swallows or outlives its cancellation — an
async generator being closed, a gRPC call, a thread behind `to_thread` — hangs the
run anyway. Seed 9 of the disk/clock/lock campaign (2026-11-26, f9877b1) did so after
its read-back: every process still up, the runner silent for 55 minutes.

Here a wait is

* `Stalls.wait(what, awaitable, timeout)`: the awaitable as a task, `asyncio.wait` for
  it at most `timeout` s; past that it is cancelled and given `GRACE` s to finish, then
  abandoned. Either way the stall is recorded — what was waited for, for how long, and
  where the task was waiting (its await chain: file:line function) — and the run goes
  on (or, with `required`, ends with `HarnessStall` naming it);
* `Stalls.thread(what, fn, timeout)`: a blocking call on a daemon thread of its own; a
  call that does not return in time is recorded with the line it is blocked on and
  left behind (a daemon thread never holds up the exit);
* `run(coro)`: `asyncio.run` for the harness, with the loop's default executor on
  daemon threads (a `to_thread` call stuck forever neither starves the later ones of
  the six workers a 2-core machine gets, nor blocks the interpreter's exit by being
  joined) and a shutdown that gives leftover tasks `GRACE` s to honour their
  cancellation and names those that did not, instead of awaiting them forever.

The stalls go into the run's metadata (`harness_stalls`) and the report's counts, so
the run ends "not ok" with its reason (chaos/checker.py, chaos/campaign.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import structlog

__all__ = ["GRACE", "DaemonThreads", "HarnessStall", "Stalls", "run", "where"]

log = structlog.get_logger("chaos.bounded")

T = TypeVar("T")

GRACE = 5.0
"""Seconds a timed-out task gets to finish after it was cancelled."""


class HarnessStall(RuntimeError):
    """A step the run cannot do without did not finish within its bound."""


def _site(frame: Any) -> str:
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"


def where(aw: Any, depth: int = 8) -> str:
    """Where a task (or coroutine) is waiting: its await chain, outermost first, as
    `file:line function` steps, then into the task or gather it awaits (`depth` tasks
    deep), ending with what the innermost one awaits when that is no task (a future, a
    thread's result)."""
    steps: list[str] = []
    obj = aw.get_coro() if isinstance(aw, asyncio.Task) else aw
    for _ in range(64):
        frame = (getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
                 or getattr(obj, "ag_frame", None))
        if frame is not None:
            steps.append(_site(frame))
        nxt = (getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
               or getattr(obj, "ag_await", None))
        if nxt is None or not any(hasattr(nxt, a) for a in ("cr_frame", "gi_frame", "ag_frame")):
            break
        obj = nxt
    waiter = getattr(aw, "_fut_waiter", None) if isinstance(aw, asyncio.Task) else None
    if waiter is not None and depth > 0:
        children = [c for c in getattr(waiter, "_children", ()) if not c.done()]
        if isinstance(waiter, asyncio.Task):
            steps.append(f"task {waiter.get_name()}: {where(waiter, depth - 1)}")
        elif children:
            steps.append(f"gather ({len(children)} not done), first: {where(children[0], depth - 1)}")
        else:
            steps.append("a thread's result" if "_chain_future" in repr(
                getattr(waiter, "_callbacks", "")) or "wrap_future" in repr(waiter)
                else "a future")
    return " > ".join(steps) or "nowhere (done)"


def _thread_site(thread: threading.Thread, limit: int = 4) -> str:
    frame = sys._current_frames().get(thread.ident or -1)  # noqa: SLF001 - diagnostics only
    if frame is None:
        return "(thread gone)"
    stack = traceback.extract_stack(frame)[-limit:]
    return " > ".join(f"{Path(s.filename).name}:{s.lineno} {s.name}" for s in stack)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned task's outcome as seen (no 'exception never retrieved')."""
    if not task.cancelled():
        task.exception()


class Stalls:
    """The stalls of one run, and the bounded waits that record them."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def _stalled(self, what: str, timeout: float, site: str, required: bool) -> None:
        msg = f"{what}: not done within {timeout:g} s (waiting at {site})"
        self.items.append(msg)
        log.error("harness.stalled", what=what, timeout=timeout, at=site)
        if required:
            raise HarnessStall(msg)

    async def wait(self, what: str, aw: Awaitable[T], timeout: float, *,
                   default: Any = None, required: bool = False,
                   grace: float = GRACE) -> T | Any:
        """`aw`'s result, or `default` (a stall recorded) if it is not done within
        `timeout` s. Its exceptions propagate as they would have."""
        task = asyncio.ensure_future(aw)
        try:
            await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            return task.result()
        site = where(task)
        task.cancel()
        await asyncio.wait({task}, timeout=grace)
        if task.done():
            _retrieve(task)
        else:
            task.add_done_callback(_retrieve)
            site += f"; still running {grace:g} s after it was cancelled: abandoned"
        self._stalled(what, timeout, site, required)
        return default

    async def thread(self, what: str, fn: Callable[..., T], *args: Any, timeout: float,
                     default: Any = None, required: bool = False) -> T | Any:
        """`fn(*args)` on a daemon thread of its own; `default` (a stall recorded, the
        thread left behind) if it does not return within `timeout` s."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, exc: BaseException | None) -> None:
            if not fut.done():
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)

        def body() -> None:
            try:
                result, exc = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - handed to the waiting task
                result, exc = None, e
            try:
                loop.call_soon_threadsafe(settle, result, exc)
            except RuntimeError:
                pass  # the loop is gone: nobody waits any more

        t = threading.Thread(target=body, name=f"chaos: {what}", daemon=True)
        t.start()
        try:
            await asyncio.wait({fut}, timeout=timeout)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        if fut.done():
            return fut.result()
        fut.cancel()
        self._stalled(what, timeout, f"a thread blocked in {_thread_site(t)}", required)
        return default


class DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """An executor that runs every call on a new daemon thread: none waits for a free
    worker, and none is joined at shutdown or at the interpreter's exit. (A
    ThreadPoolExecutor by type only: asyncio's loop takes no other as its default; its
    own pool of workers is never started.)"""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="chaos-unused")
        self._live: dict[threading.Thread, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
               ) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        name = getattr(fn, "__qualname__", None) or getattr(getattr(fn, "func", None),
                                                            "__qualname__", repr(fn))

        def body() -> None:
            try:
                if not fut.set_running_or_notify_cancel():
                    return
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to the future
                    fut.set_exception(exc)
            finally:
                with self._lock:
                    self._live.pop(threading.current_thread(), None)

        t = threading.Thread(target=body, name=f"chaos-executor: {name}"[:80], daemon=True)
        with self._lock:
            self._live[t] = (name, time.monotonic())
        t.start()
        return fut

    def running(self) -> list[str]:
        """The calls still running, with how long and where."""
        now = time.monotonic()
        with self._lock:
            live = list(self._live.items())
        return [f"{name} for {now - t0:.0f} s at {_thread_site(t)}" for t, (name, t0) in live]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to join: a call still running is left to its daemon thread."""


def run(main: Coroutine[Any, Any, T], *, grace: float = GRACE) -> T:
    """`asyncio.run(main)` with the harness's bounds: a daemon-thread default executor,
    and a shutdown that gives leftover tasks `grace` s to honour their cancellation,
    logs those that did not (and executor calls still running), and never waits on
    them longer. Ctrl-C (SIGINT) or SIGTERM (`timeout`, a CI runner) cancels `main`,
    which then cleans up as it would; a second one stops waiting for the clean-up (the
    members die with this process anyway: tools/lifetime.py)."""
    loop = asyncio.new_event_loop()
    executor = DaemonThreads()
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    task = loop.create_task(main)
    interrupted = False
    previous = None

    def on_sigint(_signum: int, _frame: Any) -> None:
        nonlocal interrupted
        if interrupted:  # a second Ctrl-C: stop waiting for the clean-up
            raise KeyboardInterrupt
        interrupted = True
        loop.call_soon_threadsafe(task.cancel)

    previous_term = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, on_sigint)
        previous_term = signal.signal(signal.SIGTERM, on_sigint)
    try:
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        try:
            _shutdown(loop, executor, grace)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _shutdown(loop: asyncio.AbstractEventLoop, executor: DaemonThreads, grace: float) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=grace))
        left = [t for t in pending if not t.done()]
        for t in pending:
            if t.done():
                _retrieve(t)
            else:
                t.add_done_callback(_retrieve)
        if left:
            log.error("harness.tasks_abandoned", count=len(left),
                      tasks=[f"{t.get_name()} at {where(t)}" for t in left[:10]])
    gens = loop.create_task(loop.shutdown_asyncgens())
    loop.run_until_complete(asyncio.wait({gens}, timeout=grace))
    if not gens.done():
        gens.cancel()
        gens.add_done_callback(_retrieve)
    threads = executor.running()
    if threads:
        log.warning("harness.threads_left", count=len(threads), calls=threads[:10])
