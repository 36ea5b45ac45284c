"""``import pallas_triton as pltriton`` exposes upstream ``jax.experimental.pallas.triton``.

The 16 names and their parameters come from ``reference/upstream-api-jax-0.10.2.md``
(section ``jax.experimental.pallas.triton``), produced by introspecting upstream; the
names are also listed literally so the test runs without the reference file.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import pallas_triton as pltriton

_CANDIDATES = [
    Path(__file__).resolve().parents[3] / "reference" / "upstream-api-jax-0.10.2.md",
    Path(__file__).resolve().parents[4] / "shared" / "reference" / "upstream-api-jax-0.10.2.md",
]
REFERENCE = next((p for p in _CANDIDATES if p.exists()), None)

UPSTREAM_NAMES = (
    "CompilerParams approx_tanh atomic_add atomic_and atomic_cas atomic_max atomic_min "
    "atomic_or atomic_xchg atomic_xor debug_barrier dot elementwise_inline_asm load "
    "max_contiguous store"
).split()


def _reference_entries() -> list[tuple[str, str, str]]:
    if REFERENCE is None:
        pytest.skip("reference/upstream-api-jax-0.10.2.md is not available")
    text = REFERENCE.read_text()
    section = text.split("## `jax.experimental.pallas.triton` ->", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `(\w+)` \(([^)]*)\)(?: `(.*)`)?$", section, re.M)


def _param_names(signature: str) -> list[str]:
    """Parameter names of a rendered signature such as ``(a, b: 'int' = 1, *, c)``."""
    inner = signature.split(") ->")[0].strip("()")
    names = []
    for part in re.split(r",\s*(?![^\[]*\])", inner):
        part = part.strip()
        if part and part not in ("*", "/"):
            names.append(part.split(":")[0].split("=")[0].strip().lstrip("*"))
    return names


def test_the_reference_lists_the_16_literal_names():
    assert sorted(n for n, _, _ in _reference_entries()) == sorted(UPSTREAM_NAMES)


@pytest.mark.parametrize("name", UPSTREAM_NAMES)
def test_every_upstream_name_exists_and_is_exported(name):
    assert hasattr(pltriton, name) and name in pltriton.__all__


def test_functions_take_upstreams_parameters_in_order():
    for name, kind, sig in _reference_entries():
        if kind != "function":
            continue
        got = list(inspect.signature(getattr(pltriton, name)).parameters)
        assert got == _param_names(sig), name


def test_compiler_params_accept_upstreams_fields():
    params = pltriton.CompilerParams(num_warps=8, num_stages=2)
    assert (params.num_warps, params.num_stages) == (8, 2)
