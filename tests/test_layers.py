"""The house's layers (docs/architecture.md): no import circles between files, no
import running up between folders, roles never import each other, and the picture in
the docs is the one the code draws today (`make layers`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import layers

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_has_no_circle_and_no_upward_import() -> None:
    g = layers.build(ROOT)
    assert len(g.files) > 100, "the tree was not read"
    assert layers.problems(g) == []


def test_the_picture_in_the_docs_is_current() -> None:
    doc = ROOT / "docs" / "architecture.md"
    rendered = layers.render_into(doc, layers.mermaid(layers.build(ROOT)))
    assert doc.read_text() == rendered, "docs/architecture.md is stale: run `make layers`"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(("files", "expected"), [
    ({"coordinator/__init__.py": "", "coordinator/a.py": "from .b import x\n",
      "coordinator/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                          "    from .a import y\n"},
     "import circle of 2 files: coordinator/a.py -> coordinator/b.py; "
     "coordinator/b.py -> coordinator/a.py"),
    ({"protocol/__init__.py": "", "protocol/m.py": "def f():\n    import quire.client\n",
      "quire/__init__.py": "", "quire/client.py": ""},
     "upward import: protocol/m.py (layer 1, protocol/) imports quire.client (layer 3, quire/)"),
    ({"workers/__init__.py": "", "workers/t.py": "from coordinator import spool\n",
      "coordinator/__init__.py": "", "coordinator/spool.py": ""},
     "role imports a role: workers/t.py imports coordinator.spool (coordinator/)"),
])
def test_the_check_names_the_files(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    found = layers.problems(layers.build(_tree(tmp_path, files)))
    assert expected in found


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"protocol/__init__.py": "", "quire/__init__.py": "import protocol\n",
                            "tools/__init__.py": "from quire import x\n"})
    assert layers.problems(layers.build(root)) == []
