"""What `quire up` does when one of its members exits: the policy, with no IO.

A member that exits is restarted after a backoff that doubles with each exit in a
sliding window (`backoff`, 2×, 4×, … capped at `backoff_max`); one that exits more than
`crash_loop_limit` times within `window` seconds is crash-looping and given up on — left
down, loudly, while the rest keeps serving. With `restart=False` (`quire up
--no-restart`) a member that exits is simply left down.

`Supervision` only decides: the caller passes the monotonic time of each exit and does
the waiting, restarting and printing (tools/supervisor.py). That keeps every decision
testable without a process or a clock.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Action", "Decision", "RestartPolicy", "Supervision", "describe_exit"]


class Action(str, Enum):
    RESTART = "restart"
    """Start it again after `Decision.delay` seconds."""
    LEAVE_DOWN = "leave-down"
    """--no-restart: it stays down, by request."""
    GIVE_UP = "give-up"
    """It is crash-looping: stays down, and `quire up` will exit non-zero."""


@dataclass(frozen=True)
class RestartPolicy:
    restart: bool = True
    backoff: float = 0.5
    """Delay before the first restart, seconds."""
    backoff_max: float = 8.0
    """The delay doubles per exit within `window`, up to this."""
    crash_loop_limit: int = 5
    """More exits than this within `window` is a crash loop."""
    window: float = 60.0
    """Seconds over which exits are counted; older ones are forgiven."""

    def __post_init__(self) -> None:
        if self.backoff < 0 or self.backoff_max < self.backoff:
            raise ValueError("need 0 <= backoff <= backoff_max")
        if self.crash_loop_limit < 1 or self.window <= 0:
            raise ValueError("need crash_loop_limit >= 1 and window > 0")


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float = 0.0
    """For RESTART: seconds to wait before starting it again."""
    exits: int = 1
    """Exits of this member within the window, this one included."""


@dataclass
class Supervision:
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    _exits: dict[str, list[float]] = field(default_factory=dict)
    given_up: list[str] = field(default_factory=list)
    """Members that crash-looped, in the order they were given up on."""

    def exited(self, name: str, now: float) -> Decision:
        """`name` exited (or failed to come up) at monotonic time `now`: what next."""
        recent = [t for t in self._exits.get(name, ()) if now - t < self.policy.window]
        recent.append(now)
        self._exits[name] = recent
        if not self.policy.restart:
            return Decision(Action.LEAVE_DOWN, exits=len(recent))
        if len(recent) > self.policy.crash_loop_limit:
            if name not in self.given_up:
                self.given_up.append(name)
            return Decision(Action.GIVE_UP, exits=len(recent))
        delay = min(self.policy.backoff_max, self.policy.backoff * 2 ** (len(recent) - 1))
        return Decision(Action.RESTART, delay=delay, exits=len(recent))

    @property
    def crash_looped(self) -> bool:
        return bool(self.given_up)


def describe_exit(returncode: int | None) -> str:
    """`subprocess` return code as words: "exit code 1", "killed by SIGKILL"."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
