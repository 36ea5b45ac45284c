"""Fixtures of the conformance suite's own tests.

``toy_backend`` installs the example plugin in ``conformance/examples/toy_backend``
through a real entry point: it writes a ``.dist-info`` directory whose
``entry_points.txt`` is generated from the example's ``pyproject.toml`` and puts it, with
the example's sources, on ``sys.path``; discovery then goes through
``importlib.metadata`` exactly as for an installed package.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

import pallas.plugins

TOY = Path(__file__).resolve().parents[1] / "examples" / "toy_backend"


def write_dist_info(root: Path) -> Path:
    """Writes ``toy_pallas_backend-0.1.0.dist-info`` under ``root`` from the example's
    pyproject.toml and returns ``root``."""
    meta = tomllib.loads((TOY / "pyproject.toml").read_text())["project"]
    dist = root / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    lines = []
    for group, eps in meta["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in eps.items()]
        lines.append("")
    (dist / "entry_points.txt").write_text("\n".join(lines))
    return root


@pytest.fixture(scope="session")
def toy_site(tmp_path_factory) -> list[str]:
    """The ``sys.path`` entries that make the toy backend installed."""
    root = write_dist_info(tmp_path_factory.mktemp("toy_site"))
    return [str(root), str(TOY / "src")]


@pytest.fixture
def toy_backend(toy_site, monkeypatch):
    """The toy backends, discovered through their entry points; forgotten afterwards."""
    for p in reversed(toy_site):
        monkeypatch.syspath_prepend(p)
    for mod in [m for m in sys.modules if m.startswith("toy_pallas_backend")]:
        monkeypatch.delitem(sys.modules, mod)
    pallas.plugins.reset()
    yield {b.name: b for b in pallas.plugins.list_backends()}
    pallas.plugins.reset()
