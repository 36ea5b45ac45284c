"""Every package of the repository declares each third-party module it imports.

Users install wheels with plain pip, so a module that is only present because another
package (or the development environment) happened to pull it in breaks their install.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGES = sorted(p.parent for p in [*ROOT.glob("packages/*/pyproject.toml"),
                                     ROOT / "conformance" / "pyproject.toml"] if p.exists())

# Import name -> distribution name, where they differ.
DIST = {"jaxlib": "jaxlib", "ml_dtypes": "ml_dtypes", "yaml": "pyyaml"}


def _imports(src: pathlib.Path) -> set[str]:
    names = set()
    for f in src.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def _declared(pyproject: pathlib.Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("-", "_")
            for r in reqs}


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_third_party_imports_are_declared(pkg):
    ours = {p.name for p in (ROOT / "packages").glob("*/src/*")} | {"pallas_conformance"}
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    third = {m for m in _imports(pkg / "src") if m not in stdlib and m not in ours}
    declared = _declared(pkg / "pyproject.toml")
    missing = sorted(m for m in third
                     if DIST.get(m, m).lower().replace("-", "_") not in declared)
    assert not missing, f"{pkg.name} imports {missing} without declaring them"
