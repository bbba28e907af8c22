"""Tests on simulated hosts (network namespaces, tools.hosts). They need root and
`ip`/`nft`, which CI has; elsewhere they skip with the harness's one-line reason."""

from __future__ import annotations

import pytest

from tools.hosts import available

REASON = available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REASON is None:
        return
    skip = pytest.mark.skip(reason=REASON)
    for item in items:
        if "tests/hosts/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
