"""No package of the repository imports itself in a circle.

A cycle held open by a function-local import works until someone moves the import, and
it hides which layer a module belongs to. The walk reads every ``import`` of every
module, at module level and inside functions (not under ``if TYPE_CHECKING:``), keeps
the edges between two modules of the same package, and finds the strongly connected
components. ``KNOWN_CYCLES`` is the ratchet while the layering is repaired (issue 33):
a cycle not listed fails, and so does a listed one that no longer exists as listed, so
the list only shrinks. The same holds for ``LOCAL_IMPORTS_AT_MOST``, the number of
function-local imports of a package's own modules.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SOURCES = sorted([*ROOT.glob("packages/*/src/*/__init__.py"),
                  ROOT / "conformance" / "src" / "pallas_conformance" / "__init__.py"])
PACKAGES = {init.parent.name: init.parent for init in SOURCES if init.exists()}

# Cycles still to break, each the exact set of modules of one strongly connected
# component (module names relative to the package). Remove an entry when it is broken.
KNOWN_CYCLES: dict[str, list[frozenset[str]]] = {}

# Function-local imports of the package's own modules (a ratchet: only down).
LOCAL_IMPORTS_AT_MOST = {
    "pallas": 1, "pallas_tpu": 13, "pallas_mosaic_gpu": 11, "pallas_triton": 17,
    "pallas_tpu_sparsecore": 10, "pallas_conformance": 1,
}


def _modules(pkg_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    for f in pkg_dir.rglob("*.py"):
        rel = f.relative_to(pkg_dir).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join((pkg_dir.name, *parts))] = f
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """Yields (import node, inside a function) for every import outside TYPE_CHECKING."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from walk(tree, False)


def _targets(node, module: str, is_pkg: bool, modules) -> list[str]:
    """The modules of ``modules`` that ``node``, written in ``module``, imports."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            parts = module.split(".") if is_pkg else module.split(".")[:-1]
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def _graph(pkg: str):
    modules = _modules(PACKAGES[pkg])
    edges: dict[str, set[str]] = {m: set() for m in modules}
    local = 0
    for m, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_function in _imports(tree):
            targets = _targets(node, m, path.name == "__init__.py", modules)
            edges[m].update(targets)
            local += bool(in_function and targets)
    return edges, local


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


def _relative(pkg: str, cycle: frozenset[str]) -> frozenset[str]:
    return frozenset(m[len(pkg) + 1:] if m != pkg else "" for m in cycle)


@pytest.mark.parametrize("pkg", sorted(PACKAGES))
def test_no_import_cycle_beyond_the_known_ones(pkg):
    edges, _ = _graph(pkg)
    found = [_relative(pkg, c) for c in _cycles(edges)]
    known = KNOWN_CYCLES.get(pkg, [])
    new = [sorted(c) for c in found if c not in known]
    assert not new, f"{pkg}: new import cycles (break them, do not list them): {new}"
    gone = [sorted(c) for c in known if c not in found]
    assert not gone, (f"{pkg}: these listed cycles are broken or changed: remove or "
                      f"update their KNOWN_CYCLES entries: {gone}")


@pytest.mark.parametrize("pkg", sorted(PACKAGES))
def test_function_local_imports_of_own_modules_only_go_down(pkg):
    _, local = _graph(pkg)
    limit = LOCAL_IMPORTS_AT_MOST[pkg]
    assert local <= limit, (f"{pkg} has {local} function-local imports of its own modules "
                            f"(at most {limit}); import at module level, in layer order")


def test_the_walk_finds_a_cycle_held_open_by_a_function_local_import(tmp_path):
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from toy import b\n")
    (pkg / "b.py").write_text("def f():\n    from toy.a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from toy import a\n")
    PACKAGES["toy"] = pkg
    try:
        edges, local = _graph("toy")
    finally:
        del PACKAGES["toy"]
    assert [_relative("toy", c) for c in _cycles(edges)] == [frozenset({"a", "b"})]
    assert local == 1
