"""Shared fixtures of pallas-core's tests.

Tests run with ``--import-mode=importlib``, so helpers shared between test files live
here as fixtures rather than in an importable module.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pallas.plugins
from pallas._src.pallas_call import lower_with_interpreter

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def rng():
    """A seeded numpy generator, so failures reproduce."""
    return np.random.default_rng(0)


@pytest.fixture
def clean_registry():
    """Forgets discovered backends before and after the test."""
    pallas.plugins.reset()
    yield
    pallas.plugins.reset()


def _install_fixture_distribution(monkeypatch, name: str) -> str:
    """Puts the fixture directory ``name`` (a module plus its ``.dist-info``) on
    ``sys.path``, as ``pip install`` would, and forgets discovered backends."""
    path = str(FIXTURES / name)
    monkeypatch.syspath_prepend(path)
    modules = {p.stem for p in (FIXTURES / name).glob("*.py")}
    for mod in [m for m in sys.modules if m in modules]:
        monkeypatch.delitem(sys.modules, mod)
    pallas.plugins.reset()
    return path


@pytest.fixture
def toy_backend(monkeypatch, clean_registry):
    """The throwaway third-party ``toy_backend`` distribution, installed for one test.

    Its ``toy_backend-0.1.dist-info/entry_points.txt`` declares the entry point
    ``toy = toy_backend`` in the group ``pallas.backends``, so discovery goes through
    ``importlib.metadata`` exactly as for a pip-installed package. Yields the path.
    """
    path = _install_fixture_distribution(monkeypatch, "toy_backend")
    yield path
    pallas.plugins.reset()


@pytest.fixture
def broken_backend(monkeypatch, clean_registry):
    """A distribution with three broken ``pallas.backends`` entry points: ``broken``
    (its module raises on import), ``faulty`` (its ``pallas_backends`` hook raises) and
    ``bogus`` (returns a non-Backend; its ``pallas_interpret_rules`` hook raises)."""
    path = _install_fixture_distribution(monkeypatch, "broken_backend")
    yield path
    pallas.plugins.reset()


@pytest.fixture
def rival_backend(monkeypatch, clean_registry):
    """A distribution whose entry point ``a_rival`` (sorting before ``toy``) provides a
    second backend called ``toy``."""
    path = _install_fixture_distribution(monkeypatch, "rival_backend")
    yield path
    pallas.plugins.reset()


class _RecordingBackend(pallas.plugins.Backend):
    """Lowers through the interpreter but counts as compiled; records its calls."""

    def lower(self, request):
        self.calls.append(dict(name=request.name, grid=request.grid_mapping.grid,
                               cost=request.cost_estimate))
        return lower_with_interpreter(request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                                      grid_mapping=request.grid_mapping)


@pytest.fixture
def compiled_backend(clean_registry):
    """A backend named ``transforms_test`` that counts as compiled (not interpret) and
    records each call it lowers (name, grid, cost) in ``.calls``."""
    b = _RecordingBackend(name="transforms_test", version="0", platforms=("cpu",))
    b.calls = []
    pallas.plugins.register_backend(b)
    return b
