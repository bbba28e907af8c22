"""spark/ is layer 4: it imports protocol and fragment_store (and third-party
libraries), never another role, the client or the CLI; and no module grows past ~400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("coordinator", "workers", "quire.client", "tools.cli", "chaos", "tests")


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
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_modules_stay_small() -> None:
    for path in sorted((ROOT / "spark").rglob("*.py")):
        assert len(path.read_text().splitlines()) <= 400, path
