"""spark/ is layer 4: it imports protocol and fragment_store (and third-party
libraries), never another role or the CLI; and no module grows past ~400 lines.

The client library (quire.client) is allowed only where a stream needs the cluster: the
unpersisted tail of a micro-batch (committed-only reads from the coordinators), the
driver's write heads and journal listing, the sink's appends, and a job target making its
output journal (jobs/dask_targets.py, as the Celery target does). Batch reads stay
store-only, so a batch job runs with no broker reachable."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("coordinator", "workers", "quire.client", "tools.cli", "chaos", "tests")
CLIENT_USERS = {"stream.py", "stream_plan.py", "tail.py", "appender.py", "exactly_once.py",
                "jobs/minute_counts.py", "jobs/dask_targets.py"}
"""spark/ modules that may import quire.client (streams and the sink; see above)."""


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_spark_imports_only_lower_layers() -> None:
    files = sorted((ROOT / "spark").rglob("*.py")) + [ROOT / "bench" / "batch.py"]
    for path in files:
        bad = {m for m in _imports(path) if m.split(".")[0] in FORBIDDEN[:2] + FORBIDDEN[4:]
               or m.startswith(FORBIDDEN[2:4])}
        if path.name == "batch.py":
            bad -= {"tools.services"}
        if path.is_relative_to(ROOT / "spark") and \
                str(path.relative_to(ROOT / "spark")) in CLIENT_USERS:
            bad = {m for m in bad if not m.startswith("quire.client")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_modules_stay_small() -> None:
    for path in sorted((ROOT / "spark").rglob("*.py")):
        assert len(path.read_text().splitlines()) <= 400, path
