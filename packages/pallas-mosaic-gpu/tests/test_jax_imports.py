"""Import rules beside test_boundary.py's: JAX's private modules only in the one compat
module, and never upstream Pallas."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "pallas_mosaic_gpu"


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_jax_internals_only_in_the_compat_module():
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if any(m.startswith("jax._src") for m in _imports(p)))
    assert users == ["_src/jax_compat.py"]


def test_never_upstream_pallas():
    bad = [str(p) for p in SRC.rglob("*.py")
           if any(m.startswith(("jax.experimental.pallas", "jax._src.pallas"))
                  for m in _imports(p))]
    assert bad == []
