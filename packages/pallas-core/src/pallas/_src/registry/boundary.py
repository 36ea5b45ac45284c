"""The one-way import rule, as a check every package's tests can run.

Backends, the conformance suite, examples and third-party plugins use pallas-core only
through its public modules (``pallas``, ``pallas.plugins``, ...), never ``pallas._src``.
:func:`private_core_imports` finds the violations in a set of files, so each package
enforces the rule on itself with one assertion.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PRIVATE = "pallas._src"


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
            # ``from pallas import _src`` names the private package too.
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def private_core_imports(*roots: str | Path) -> list[str]:
    """Every import of ``pallas._src`` in the Python files under ``roots`` (files or
    folders), as ``"path:line: module"`` strings; empty when the rule holds."""
    found = []
    for f in _python_files(roots):
        try:
            tree = ast.parse(f.read_text(), filename=str(f))
        except SyntaxError as e:  # a file that does not parse cannot be checked
            found.append(f"{f}:{e.lineno}: does not parse ({e.msg})")
            continue
        lines = set()
        for line, mod in _imported_modules(tree):
            if (mod == PRIVATE or mod.startswith(PRIVATE + ".")) and line not in lines:
                lines.add(line)  # one report per import statement
                found.append(f"{f}:{line}: {mod}")
    return found


def _python_files(roots: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for r in roots:
        p = Path(r)
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += sorted(x for x in p.rglob("*.py") if "__pycache__" not in x.parts)
    return files
