"""One-way imports: pallas-tpu-sparsecore uses pallas-core and pallas-tpu only through
their public modules (``pallas``, ``pallas.plugins``, ``pallas_tpu``,
``pallas_tpu.extend``), never their ``_src`` internals."""

import ast
from pathlib import Path

from pallas.plugins import private_core_imports

PACKAGE = Path(__file__).resolve().parents[1]


def test_no_import_of_pallas_core_internals():
    assert (PACKAGE / "src").is_dir()
    assert private_core_imports(PACKAGE / "src", PACKAGE / "tests") == []


def test_no_import_of_pallas_tpu_internals():
    found = []
    for path in sorted((PACKAGE / "src").rglob("*.py")) + sorted(PACKAGE.glob("tests/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{path.name}:{node.lineno}: {n}" for n in names
                      if n == "pallas_tpu._src" or n.startswith("pallas_tpu._src.")]
    assert found == []
