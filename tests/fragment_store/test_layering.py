"""fragment_store is layer 2: it imports protocol and third-party libraries only."""

from __future__ import annotations

import ast
from pathlib import Path

import fragment_store

FORBIDDEN = ("coordinator", "workers", "spark", "quire.client", "tools.cli", "tools.services",
             "tests")


def test_fragment_store_imports_only_layer_one() -> None:
    root = Path(fragment_store.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path}: imports {name}"
                if name.startswith("quire"):
                    assert name.startswith("protocol"), f"{path}: imports {name}"
        assert len(path.read_text().splitlines()) <= 400, f"{path} is over 400 lines"
