"""Every catalogue case at the three CPU levels: lower (source), compile, emulate."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pallas_triton as pltriton

TOLERANCE = {"matmul": 2e-2, "elementwise": 2e-2, "matmul_k_grid": 2e-2}


def _flat(x):
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(x)]


def test_source_is_triton(case_name, make_case):
    f, args = make_case(case_name, False)
    src = pltriton.inspect(f, *args)
    assert "@triton.jit" in src
    assert "import triton.language as tl" in src
    compile(src, "<generated>", "exec")  # valid Python


def test_emulate_matches_interpreter(case_name, make_case, reference):
    f, args = make_case(case_name, False)
    out = pltriton.emulate(f, *args)
    ref = reference(case_name)
    tol = TOLERANCE.get(case_name, 1e-5)
    for o, r in zip(_flat(out), _flat(ref), strict=True):
        assert o.shape == r.shape and o.dtype == r.dtype
        np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64),
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("cc", [80, 90])
def test_compiles_to_ptx(case_name, make_case, cc):
    f, args = make_case(case_name, False)
    (k,) = pltriton.compile(f, *args, compute_capability=cc)
    assert k.compute_capability == cc
    assert f".target sm_{cc}" in k.ptx
    assert k.cubin


def test_resource_usage_is_read_from_the_cubin(make_case):
    f, args = make_case("matmul", False)
    (k,) = pltriton.compile(f, *args, compute_capability=80)
    usage = k.resource_usage()
    assert set(usage) == {"registers", "stack", "shared", "local"}
    assert 0 < usage["registers"] <= 255  # per-thread register file of sm_80
