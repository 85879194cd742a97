"""The package's imports run one way: no module of `pytest_commbench` imports one that imports
it back, directly or around a longer loop.

The imports are read from the sources with `ast` (nothing is imported), every import statement
wherever it stands: at module level, inside a function (an import deferred to dodge a loop is
the loop all the same), in a `try` or under `if TYPE_CHECKING:`. Importing a submodule from
outside its package imports the package too (its `__init__.py` runs first). Imports made by
importlib (`checks` finds its oracles so) are not read.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import pytest_commbench

PACKAGE = Path(pytest_commbench.__file__).resolve().parent

Edge = tuple[str, str]


def modules(package: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a package is its __init__.py)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _loaded(importer: str, name: str, names: dict[str, Path]) -> set[str]:
    """The modules an import of `name` by `importer` runs: the longest known prefix of the
    name (what follows is a name that module defines), and the packages it lies in that the
    importer does not lie in (their __init__.py runs first)."""
    while name and name not in names:
        name = name.rpartition(".")[0]
    if not name:
        return set()  # not of the package
    parts = name.split(".")
    outer = {".".join(parts[:i]) for i in range(1, len(parts))}
    return ({name} | {p for p in outer if not importer.startswith(p + ".")}) - {importer}


def imports(package: Path) -> dict[Edge, list[int]]:
    """Every import of a module of the package by another: (importer, imported) -> lines."""
    names = modules(package)
    edges: dict[Edge, list[int]] = {}
    for importer, path in names.items():
        here = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here[:len(here) - node.level + 1]
                    base = ".".join([*up, node.module] if node.module else up)
                # `from . import x` names a submodule where there is one
                wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base
                          for alias in node.names]
            else:
                continue
            for name in wanted:
                for imported in _loaded(importer, name, names):
                    edges.setdefault((importer, imported), []).append(node.lineno)
    return edges


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of the graph with more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = [stack.pop()]
            while part[-1] != node:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def one_loop(part: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest loop through the first module of a strongly connected part, as the modules
    it passes (the first again at the end)."""
    start, came = part[0], {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & set(part)):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no loop through {start}")


def cycles(package: Path, allowed: Iterable[Edge] = ()) -> list[str]:
    """Each import loop of the package, told edge by edge (file:lines imports module)."""
    lines = imports(package)
    graph: dict[str, set[str]] = {}
    for a, b in set(lines) - set(allowed):
        graph.setdefault(a, set()).add(b)
    files = modules(package)
    return ["\n".join(f"  {files[a].relative_to(package.parent)}:"
                      f"{','.join(map(str, sorted(set(lines[a, b]))))} imports {b}"
                      for a, b in zip(loop, loop[1:]))
            for loop in (one_loop(part, graph) for part in loops(graph))]


def test_the_package_has_no_import_cycles():
    found = cycles(PACKAGE)
    assert not found, "import cycles:\n" + "\n\n".join(found)


def test_a_loop_through_a_deferred_import_is_found(tmp_path):
    """The reader itself: a loop closed inside a function, and one closed by importing a
    submodule whose package's __init__.py imports the importer back."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import B\n")
    (pkg / "b.py").write_text("B = 1\n\n\ndef f():\n    from . import a\n")
    (pkg / "c.py").write_text("from .sub.leaf import X\n")
    (pkg / "sub" / "__init__.py").write_text("from .user import Y\n")
    (pkg / "sub" / "leaf.py").write_text("X = 1\n")
    (pkg / "sub" / "user.py").write_text("from ..c import Z\n")
    found = cycles(pkg)
    assert len(found) == 2, found
    assert "pkg/b.py:5 imports pkg.a" in found[0] and "pkg/a.py:1 imports pkg.b" in found[0]
    assert "pkg/c.py:1 imports pkg.sub" in found[1], found[1]
    assert not cycles(pkg, {("pkg.b", "pkg.a"), ("pkg.sub.user", "pkg.c")})



def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module an import of `start` runs (its own imports, theirs, ...), less itself."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen - {start}


def bound(path: Path, imported: bool = True) -> set[str]:
    """The names a module binds at its top level: what it defines or assigns, and (`imported`)
    what it imports."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif imported and isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


VENDOR_PACKAGES = ("pytest_commbench.toolchains", "pytest_commbench.platforms")
BUILD, TOOLCHAINS = "pytest_commbench.build", "pytest_commbench.toolchains"


def test_the_common_build_imports_no_vendor_module():
    """build.py is the machinery every vendor's toolchain shares: it imports no toolchain and no
    platform, directly or through another module, and binds none of a toolchain's names (no
    re-export: each vendor's recipe has one home, `toolchains/<vendor>.py`). A vendor's
    toolchain imports no other vendor's, nor a platform (the platforms build through them)."""
    graph: dict[str, set[str]] = {}
    for a, b in imports(PACKAGE):
        graph.setdefault(a, set()).add(b)

    def vendor(module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in VENDOR_PACKAGES)

    found = sorted(filter(vendor, reached(graph, BUILD)))
    assert not found, f"build.py imports {found}"
    files = modules(PACKAGE)
    toolchains = sorted(m for m in files if m.startswith(TOOLCHAINS + "."))
    assert {f"{TOOLCHAINS}.nvidia", f"{TOOLCHAINS}.amd"} <= set(toolchains)
    common = bound(files[BUILD])
    for toolchain in toolchains:
        others = set(filter(vendor, reached(graph, toolchain))) - {TOOLCHAINS}
        assert not others, f"{toolchain} imports {sorted(others)}"
        shared = bound(files[toolchain], imported=False) & common
        assert not shared, f"build.py binds {sorted(shared)}, names of {toolchain}"


def test_the_vendor_rule_sees_a_vendor_import(tmp_path):
    """The reader behind the rule: a deferred import of a toolchain by the common build is
    reached, and so is one made through a third module."""
    pkg = tmp_path / "pkg"
    (pkg / "toolchains").mkdir(parents=True)
    for name in ("__init__.py", "toolchains/__init__.py", "toolchains/nvidia.py"):
        (pkg / name).write_text("")
    (pkg / "build.py").write_text("def f():\n    from .helper import g\n")
    (pkg / "helper.py").write_text("from .toolchains.nvidia import X\n")
    graph: dict[str, set[str]] = {}
    for a, b in imports(pkg):
        graph.setdefault(a, set()).add(b)
    assert {"pkg.helper", "pkg.toolchains", "pkg.toolchains.nvidia"} <= reached(graph, "pkg.build")

def test_the_record_layer_imports_only_the_verdicts_and_the_standard_library():
    """Everything that writes or reads a result imports the record layer, never the other
    way round: it may import the verdicts and the standard library, nothing else."""
    import sys

    ours = {b for (a, b) in imports(PACKAGE) if a == "pytest_commbench.record"}
    assert ours == {"pytest_commbench.verdicts"}, ours
    path = modules(PACKAGE)["pytest_commbench.record"]
    outside = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            outside |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            outside.add((node.module or "").partition(".")[0])
    assert outside <= set(sys.stdlib_module_names), outside - set(sys.stdlib_module_names)
