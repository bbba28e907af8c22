"""The house's layers, read from the code: an import graph of the source tree.

Every top-level folder belongs to one layer, and a file may import only its own
folder or folders on lower layers; the roles never import each other; no two files
import each other in a circle (TYPE_CHECKING and function-local imports count: a
circle a reader must untangle is a circle). `python -m tools.layers` checks the tree
and prints what is wrong, naming the files; `--write DOC` renders the folder graph
(Mermaid) between the markers of DOC, which `make layers` keeps in
docs/architecture.md, and the test suite fails if the picture there has drifted.

Imports nothing of quire's: it reads the source as text (ast), never runs it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# Bottom to top. A folder's layer is its index here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground: wire protocol, shared types, settings, logs", ("protocol",)),
    ("fragment store: keys, codecs, stores, the index", ("fragment_store",)),
    ("client library and the cluster's shape in etcd", ("quire", "topology")),
    ("roles: the processes of a cluster", ("coordinator", "workers", "consumers", "spark",
                                           "dashboards")),
    ("tools: the CLI, local cluster, launchers, bench, chaos", ("tools", "bench", "chaos")),
)
ROLES = frozenset(LAYERS[3][1])
LAYER_OF = {folder: i for i, (_, folders) in enumerate(LAYERS) for folder in folders}
BEGIN, END = "<!-- layers:begin (make layers) -->", "<!-- layers:end -->"


@dataclass
class Graph:
    root: Path
    files: dict[str, Path] = field(default_factory=dict)
    """module name -> file"""
    edges: dict[str, set[str]] = field(default_factory=dict)
    """module -> modules of ours it imports"""

    @property
    def folder_edges(self) -> Counter[tuple[str, str]]:
        counts: Counter[tuple[str, str]] = Counter()
        for a, targets in self.edges.items():
            for b in targets:
                fa, fb = a.split(".")[0], b.split(".")[0]
                if fa != fb:
                    counts[fa, fb] += 1
        return counts

    def rel(self, module: str) -> str:
        return str(self.files[module].relative_to(self.root))


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def build(root: Path) -> Graph:
    g = Graph(root)
    for folder in LAYER_OF:
        base = root / folder
        if base.is_dir():
            for path in sorted(base.rglob("*.py")):
                g.files[_module_name(root, path)] = path
    for module, path in g.files.items():
        is_pkg = path.name == "__init__.py"
        package = module if is_pkg else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.add(_ours(g, alias.name))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:  # `from pkg import submodule` names the submodule
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in g.files else _ours(g, base))
        targets.discard("")
        targets.discard(module)
        g.edges[module] = targets
    return g


def _ours(g: Graph, name: str) -> str:
    """The deepest module of ours that `import name` loads, or ''."""
    while name and name not in g.files:
        name = name.rpartition(".")[0]
    return name


def circles(g: Graph) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(g.edges):
        if start in index:
            continue
        work = [(start, iter(sorted(g.edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g.edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def problems(g: Graph) -> list[str]:
    """Every circle and every import that runs up or across the roles, named by file."""
    out = []
    for comp in circles(g):
        ties = [f"{g.rel(a)} -> {g.rel(b)}" for a in comp for b in sorted(g.edges[a]) if b in comp]
        out.append(f"import circle of {len(comp)} files: " + "; ".join(ties))
    for a in sorted(g.edges):
        fa = a.split(".")[0]
        for b in sorted(g.edges[a]):
            fb = b.split(".")[0]
            if fa == fb:
                continue
            if LAYER_OF[fb] > LAYER_OF[fa]:
                out.append(f"upward import: {g.rel(a)} (layer {LAYER_OF[fa] + 1}, {fa}/) imports "
                           f"{b} (layer {LAYER_OF[fb] + 1}, {fb}/)")
            elif fa in ROLES and fb in ROLES:
                out.append(f"role imports a role: {g.rel(a)} imports {b} ({fb}/)")
    folder_graph = {}
    for fa, fb in g.folder_edges:
        folder_graph.setdefault(fa, set()).add(fb)
    fg = Graph(g.root, {f: g.root / f for f in LAYER_OF}, {f: folder_graph.get(f, set()) for f in LAYER_OF})
    for comp in circles(fg):
        out.append("folder circle: " + " <-> ".join(f"{f}/" for f in comp))
    return out


def mermaid(g: Graph) -> str:
    """The folders on their layers (top first) and the imports between them, counted."""
    present = {m.split(".")[0] for m in g.files}
    lines = ["```mermaid", "flowchart TB"]
    for i in reversed(range(len(LAYERS))):
        title, folders = LAYERS[i]
        lines.append(f'  subgraph L{i + 1}["{i + 1} · {title}"]')
        lines.append("    direction LR")
        for f in folders:
            if f in present:
                n = sum(1 for m in g.files if m.split(".")[0] == f)
                lines.append(f'    {f}["{f}/ · {n} files"]')
        lines.append("  end")
    for (fa, fb), n in sorted(g.folder_edges.items(), key=lambda kv: (-LAYER_OF[kv[0][0]], kv[0])):
        lines.append(f"  {fa} -->|{n}| {fb}")
    lines.append("```")
    return "\n".join(lines)


def render_into(doc: Path, block: str) -> str:
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: the markers {BEGIN!r} and {END!r} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.layers", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--write", type=Path, metavar="DOC", help="render the folder graph into DOC")
    args = ap.parse_args(argv)
    g = build(args.root)
    if args.write:
        args.write.write_text(render_into(args.write, mermaid(g)))
    found = problems(g)
    for line in found:
        print(line, file=sys.stderr)
    print(f"{len(g.files)} files, {sum(map(len, g.edges.values()))} imports, "
          f"{len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
