"""``pallas.mlir_math``: the approximations emitted as MLIR ops, run by the executor."""

from __future__ import annotations

import jax.scipy.special as jsp
import numpy as np
import pytest
from jax.interpreters import mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, func

from pallas import executor as ex
from pallas import mlir_math


class _Machine:
    def __init__(self, nslots):
        self.env = [None] * nslots


def _run_unary(emit, x: np.ndarray) -> np.ndarray:
    """Builds ``f(x) = emit(x, const)`` over ``vector<Nxf32>`` and runs it."""
    ctx = mlir.make_ir_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        vty = ir.VectorType.get([x.size], ir.F32Type.get())
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("f", ir.FunctionType.get([vty], [vty]))
            with ir.InsertionPoint(f.add_entry_block()):
                def const(c):
                    return arith.constant(vty, ir.DenseElementsAttr.get_splat(
                        vty, ir.FloatAttr.get(ir.F32Type.get(), c)))
                func.ReturnOp([emit(f.arguments[0], const)])
        cc = ex.Compiler(module, ex.UPSTREAM)
        plan = cc.region(cc.funcs["f"].regions[0])
    m = _Machine(cc.nslots)
    (out,) = ex.run(plan, m, m.env, [x])
    return np.asarray(out)


def test_erf_inv_matches_jax_in_the_centre_and_the_tails():
    x = np.asarray([-0.999999, -0.99, -0.7, -0.1, 0.0, 0.3, 0.9, 0.99999], np.float32)
    got = _run_unary(mlir_math.erf_inv, x)
    np.testing.assert_allclose(got, np.asarray(jsp.erfinv(x)), rtol=2e-6, atol=1e-6)


def test_horner_evaluates_highest_degree_first():
    x = np.asarray([0.0, 1.0, 2.0, -3.0], np.float32)
    got = _run_unary(lambda v, c: mlir_math.horner((2.0, -1.0, 5.0), v, c), x)
    np.testing.assert_allclose(got, 2 * x**2 - x + 5)


def test_integer_pow_by_squaring_and_its_reciprocal():
    x = np.asarray([0.5, 1.5, -2.0, 3.0], np.float32)
    for y in (0, 1, 2, 5, 8, -3):
        got = _run_unary(lambda v, c, y=y: mlir_math.integer_pow(v, y, c, is_float=True), x)
        np.testing.assert_allclose(got, x.astype(np.float64) ** y, rtol=1e-6)


def test_integer_pow_refuses_a_negative_exponent_on_ints():
    with pytest.raises(NotImplementedError, match="negative exponent"):
        mlir_math.integer_pow(None, -2, None, is_float=False)
