"""TPU interpret mode evaluates scalar integer/boolean arithmetic in Python, exactly as XLA."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_tpu._src.interpret import scalars

BINARY = [lax.add, lax.sub, lax.mul, lax.div, lax.rem, lax.max, lax.min, lax.eq, lax.ne,
          lax.lt, lax.le, lax.gt, lax.ge, lax.bitwise_and, lax.bitwise_or,
          lax.bitwise_xor]
VALUES = {
    np.int32: [0, 1, -1, 7, -7, 3, -3, 2**31 - 1, -(2**31)],
    np.uint32: [0, 1, 7, 3, 2**32 - 1, 2**31],
    np.int8: [0, 1, -1, 127, -128, 5, -5],
}


def _plan(f, *args):
    closed = jax.make_jaxpr(f)(*args)
    j = closed.jaxpr
    return scalars.plan(j.eqns, j.invars, j.outvars), closed


@pytest.mark.parametrize("dtype", list(VALUES))
@pytest.mark.parametrize("op", BINARY, ids=lambda op: op.__name__)
def test_binary_ops_match_xla_including_wraparound_and_signs(op, dtype):
    vals = [dtype(v) for v in VALUES[dtype]]
    run, closed = _plan(op, vals[0], vals[1])
    assert run is not None
    for a, b in itertools.product(vals, vals):
        if op in (lax.div, lax.rem) and b == 0:
            with pytest.raises(scalars.Fallback):
                run(a, b)
            continue
        (got,) = run(a, b)
        want = np.asarray(jax.jit(op)(a, b))
        assert got.dtype == want.dtype and got == want, (op.__name__, a, b, got, want)


def test_unary_conversions_and_select():
    def f(i, b):
        x = jnp.where(b, -i, i * 3 + 1) % 4
        return x.astype(jnp.int8), (x > 1).astype(jnp.int32), ~i, jnp.logical_not(b)

    run, _ = _plan(f, np.int32(0), np.bool_(True))
    assert run is not None
    for i, b in itertools.product([0, 5, -5, 2**31 - 1, 300], [True, False]):
        got = run(np.int32(i), np.bool_(b))
        want = jax.jit(f)(np.int32(i), np.bool_(b))
        for g, w in zip(got, want):
            assert g.dtype == np.asarray(w).dtype and g == np.asarray(w)


def test_floats_and_arrays_are_left_to_the_compiled_path():
    assert _plan(lambda x: x + 1.0, np.float32(1))[0] is None
    assert _plan(lambda x: x + 1, np.zeros(3, np.int32))[0] is None
    assert _plan(lambda x: lax.shift_left(x, 1), np.int32(1))[0] is None
