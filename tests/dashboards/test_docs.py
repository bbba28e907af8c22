"""docs/configuration.md and docs/dashboards.md stay in step with the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()
DASHBOARDS = (REPO / "docs" / "dashboards.md").read_text()


def table_row(doc: str, cell: str) -> str:
    row = next((ln for ln in doc.splitlines() if ln.startswith(f"| `{cell}`")), None)
    assert row is not None, f"no table row for {cell}"
    return row


def test_every_setting_is_documented_with_its_env_var_and_default() -> None:
    from protocol.config import _AWS_FALLBACKS, Settings

    for name in Settings.__struct_fields__:
        row = table_row(CONFIGURATION, name)
        assert f"`QUIRE_{name.upper()}`" in row, name
    defaults = {k: v for k, v in zip(Settings.__struct_fields__, Settings.__struct_defaults__, strict=False)
                if isinstance(v, str | int | bool) and not str(v).startswith(("/", "file:"))}
    for name, value in defaults.items():
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        assert f"`{shown}`" in table_row(CONFIGURATION, name), (name, value)
    for names in _AWS_FALLBACKS.values():
        for var in names:
            assert f"`{var}`" in CONFIGURATION, var


def test_every_worker_setting_is_documented_with_its_default() -> None:
    from workers.config import _FIELDS, WorkerSettings

    defaults = WorkerSettings()
    for field, (var, _, minimum) in _FIELDS.items():
        row = table_row(CONFIGURATION, var)
        value = getattr(defaults, field)
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert float(cells[1].strip("`")) == value, (var, cells[1], value)
        assert float(cells[2]) == minimum, (var, cells[2], minimum)


@pytest.mark.parametrize("module", ["coordinator.metrics", "coordinator.persister", "coordinator.backlog",
                                    "coordinator.index_watch", "workers.metrics",
                                    "workers.jobs_metrics",
                                    "consumers.metrics"])
def test_every_metric_is_documented(module: str) -> None:
    import importlib

    from prometheus_client import REGISTRY

    importlib.import_module(module)
    for family in REGISTRY.collect():
        if family.name.startswith("quire_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            assert re.search(rf"`{name}[{{`]", DASHBOARDS), f"{name} missing from docs/dashboards.md"
