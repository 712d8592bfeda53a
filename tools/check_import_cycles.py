"""Fails when a package's modules import each other in a circle.

    python tools/check_import_cycles.py [PACKAGE_DIR ...]   (default: triton_shm)

The import graph is read with ``ast``, without importing anything. An edge is every import
that runs: at module level (inside ``try``/``if`` too) and inside functions, since a
function-local import that only dodges a circle at import time is still a circle (the two
modules cannot be understood or moved apart). Imports under ``if TYPE_CHECKING:`` are left
out: they never run. Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so
those are edges too. Each circle is printed as one path through it; the exit status is 1 if
there is any, else 0.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

Graph = dict[str, set[str]]


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its __init__)."""
    root = package_dir.parent
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that can run: all but those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the else branch of ``if TYPE_CHECKING`` does run
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _absolute(name: str, module: str, is_package: bool, level: int) -> str:
    """``from <level dots><name> import`` in ``module``, as an absolute dotted name."""
    if level == 0:
        return name
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([name] if name else []))


def _with_parents(name: str, modules: dict[str, Path]) -> set[str]:
    """``name`` and the packages above it, those that are modules of ours."""
    parts = name.split(".")
    return {p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in modules}


def import_graph(package_dir: Path) -> Graph:
    modules = module_names(package_dir)
    graph: Graph = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets |= _with_parents(alias.name, modules)
                continue
            base = _absolute(node.module or "", module, is_package, node.level)
            targets |= _with_parents(base, modules)
            for alias in node.names:  # ``from pkg import submodule``
                if f"{base}.{alias.name}" in modules:
                    targets.add(f"{base}.{alias.name}")
        targets.discard(module)
        # a package's own modules import it first: that is no circle of theirs
        graph[module] = {t for t in targets if not module.startswith(t + ".")}
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan's
    algorithm, iterative), each as a path that starts and ends at its first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return [_path_through(graph, set(c), c[0]) for c in components]


def _path_through(graph: Graph, component: set[str], start: str) -> list[str]:
    """A shortest circle from ``start`` back to it inside ``component`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    back = [node]  # node, its predecessor, ..., start
                    while back[-1] != start:
                        back.append(came_from[back[-1]])
                    return [*reversed(back), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or [Path(__file__).resolve().parent.parent / "triton_shm"]
    found = 0
    for package_dir in dirs:
        if not (package_dir / "__init__.py").is_file():
            print(f"{package_dir}: not a package (no __init__.py)", file=sys.stderr)
            return 2
        for circle in cycles(import_graph(package_dir)):
            found += 1
            print("import cycle: " + " -> ".join(circle))
    if found:
        print(f"{found} import cycle(s): move what both sides need to a module of its own, or import it "
              "for annotations only (under `if TYPE_CHECKING:`)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
