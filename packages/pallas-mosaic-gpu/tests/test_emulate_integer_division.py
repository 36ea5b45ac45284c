"""Integer division by zero at emulate gives what the GPU computes, all bits set (``-1``
signed, the largest value unsigned), which is also XLA's result for ``lax.div``; other
quotients round toward zero."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint32])
def test_dividing_by_zero_gives_all_bits_set_as_xla_does(emulate, dtype):
    def body(x_ref, y_ref, o_ref):
        o_ref[...] = lax.div(x_ref[...], y_ref[...])

    f = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((256,), dtype),
                       backend="mosaic_gpu")
    x = jnp.arange(256, dtype=jnp.int32).astype(dtype) - (128 if dtype == jnp.int32 else 0)
    y = jnp.tile(jnp.asarray([0, 3, -3, 7], jnp.int32), 64).astype(dtype)
    (got,) = emulate(f, x, y)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(lax.div(x, y)))
    assert (np.asarray(got)[::4] == np.asarray(-1).astype(dtype)).all()
