"""The host harness: simulated hosts as network namespaces on a virtual switch, for
multi-host tests, `quire chaos --hosts` and benches (layer 5; see README.md here)."""

from tools.hosts.harness import Host, HostHarness, available
from tools.hosts.netns import NetnsError, NetnsUnavailable, sweep_stale

__all__ = ["Host", "HostHarness", "NetnsError", "NetnsUnavailable", "available", "sweep_stale"]
