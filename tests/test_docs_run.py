"""The docs run: every shell block of README.md and docs/*.md marked runnable runs, in
order, against a fresh `quire up` in a temporary data dir, and its documented output
shape still holds.

A block is marked by an HTML comment on the line before its fence:

    <!-- docs-run -->                               run it; it must exit 0
    <!-- docs-run expect="appended \\d+ bytes" -->  ... and its output must match (regex;
                                                    `expect` may repeat; `\\"` is a quote)
    <!-- docs-run skip="needs S3 and TLS" -->       known, not run here: reported as skipped
    <!-- docs-run needs="spark" -->                 starts a JVM: runs when QUIRE_DOCS_SPARK=1
                                                    (a JVM start is 20 s idle, minutes on a
                                                    loaded machine; tests/spark cover the jobs)

Every ```sh, ```bash and ```shell block must carry one of these (test_every_shell_block_is_marked),
so a new block is either run here or says why not. A skip names what the block needs that a
local `quire up` lacks (S3, TLS, several hosts, root, a second cluster, a long run).

Blocks run as a new user's second terminal would: `bash -e -o pipefail`, a working
directory of their own (holding `.venv`, a link to this tree's), PATH with `.venv/bin`,
and HOME whose default data dir is the one `quire up` runs in, and no QUIRE_* variable:
commands find the cluster themselves (protocol/discovery.py). Files a block writes stay
for the blocks after it. The cluster's logs are named when a block fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tools.services import QuireUpService

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARK = re.compile(r"^<!--\s*docs-run(?P<attrs>.*?)-->\s*$")
SHELL_FENCES = ("```sh", "```bash", "```shell")
ATTR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
BLOCK_TIMEOUT = 600.0
"""Seconds one block may take (a Spark block starts a JVM, slow on a loaded machine)."""

pytestmark = pytest.mark.timeout(900)


@dataclass
class Block:
    doc: str
    line: int
    code: str
    expect: list[str] = field(default_factory=list)
    skip: str = ""
    needs: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def blocks(paths: list[Path] = DOCS) -> list[Block]:
    """Every marked block, in document order (README first, then docs/ by name)."""
    found = []
    for path in paths:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = MARK.match(line.strip())
            if not m:
                continue
            rel = _rel(path)
            fence = lines[i + 1].strip() if i + 1 < len(lines) else ""
            assert fence in SHELL_FENCES, f"{rel}:{i + 1}: docs-run must precede a ```sh block"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            block = Block(rel, i + 2, "\n".join(lines[i + 2:end]) + "\n")
            for key, value in ATTR.findall(m["attrs"]):
                value = value.replace('\\"', '"')
                if key == "expect":
                    re.compile(value)
                    block.expect.append(value)
                elif key == "skip":
                    block.skip = value
                elif key == "needs":
                    assert value == "spark", f"{rel}:{i + 1}: needs={value!r}: only spark is known"
                    block.needs = value
                else:
                    raise AssertionError(f"{rel}:{i + 1}: unknown docs-run attribute {key!r}")
            found.append(block)
    return found


def unmarked(paths: list[Path] = DOCS) -> list[str]:
    """`doc:line` of every shell block with no docs-run marker on the line before it."""
    found = []
    for path in paths:
        lines = path.read_text().splitlines()
        inside = False
        for i, line in enumerate(lines):
            fence = line.strip()
            if inside:
                inside = fence != "```"
                continue
            if not fence.startswith("```"):
                continue
            inside = True
            if fence in SHELL_FENCES and not (i and MARK.match(lines[i - 1].strip())):
                found.append(f"{_rel(path)}:{i + 1}")
    return found


BLOCKS = blocks()


def test_every_shell_block_is_marked() -> None:
    missing = unmarked()
    assert not missing, (f"shell blocks with no <!-- docs-run ... --> marker (run it, or "
                         f"skip=\"what it needs\"): {missing}")


def test_unmarked_finds_a_bare_block(tmp_path: Path) -> None:
    doc = tmp_path / "probe.md"
    doc.write_text("```sh\nquire up\n```\n\n<!-- docs-run -->\n```bash\ntrue\n```\n"
                   "```python\n```sh\n```\n  ```shell\n  ls\n  ```\n")
    assert unmarked([doc]) == ["probe.md:1", "probe.md:12"]
    assert [b.line for b in blocks([doc])] == [6]


def test_readme_has_a_runnable_walkthrough() -> None:
    readme = [b for b in BLOCKS if b.doc == "README.md" and not b.skip]
    assert len(readme) >= 5, [b.id for b in readme]
    text = "".join(b.code for b in readme)
    for step in ("quire append", "quire read", "quire consumer run", "quire spark run",
                 "quire journals prune"):
        assert step in text, step
    streaming = [b for b in BLOCKS if b.doc == "README.md" and "spark.jobs.minute_counts" in b.code]
    assert streaming, "the walkthrough shows the streaming job"


@dataclass
class Terminal:
    cwd: Path
    env: dict[str, str]
    up: QuireUpService


@pytest.fixture(scope="module")
def terminal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Terminal]:
    home = tmp_path_factory.mktemp("docs-home")
    data = home / ".local" / "share" / "quire"
    cwd = home / "work"
    cwd.mkdir()
    (cwd / ".venv").symlink_to(Path(sys.executable).parent.parent)
    up_env = {"HOME": str(home), "QUIRE_DATA_DIR": "", "XDG_DATA_HOME": ""}
    with QuireUpService(data, "--no-restart", env=up_env) as up:
        env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb"}
        for key in ("JAVA_HOME",):  # what Spark needs from the machine, not from quire
            if key in os.environ:
                env[key] = os.environ[key]
        yield Terminal(cwd, env, up)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_block_runs(block: Block, terminal: Terminal) -> None:
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    if block.needs == "spark" and os.environ.get("QUIRE_DOCS_SPARK") != "1":
        pytest.skip(f"{block.id}: starts a JVM; run with QUIRE_DOCS_SPARK=1")
    try:
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code],
                                cwd=terminal.cwd, env=terminal.env, capture_output=True,
                                text=True, timeout=BLOCK_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{block.id} still running after {BLOCK_TIMEOUT:g}s: "
                             f"{(exc.stdout or b'')[-2000:]!r}") from None
    output = result.stdout + result.stderr
    where = f"{block.id} (cluster logs: {terminal.up.data_dir / 'logs'}, {terminal.up.log_path})"
    assert result.returncode == 0, f"{where} exited {result.returncode}:\n{output[-3000:]}"
    for pattern in block.expect:
        assert re.search(pattern, output), f"{where}: no match for {pattern!r} in:\n{output[-3000:]}"
