"""plgpu's atomic stores combine a value into the whole ref, from every program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu


@pytest.mark.parametrize("op,init,combine", [
    (plgpu.atomic_add, 0, lambda a, b: a + b),
    (plgpu.atomic_max, -100, np.maximum),
    (plgpu.atomic_min, 100, np.minimum),
    (plgpu.atomic_or, 0, np.bitwise_or),
    (plgpu.atomic_xor, 0, np.bitwise_xor),
    (plgpu.atomic_and, -1, np.bitwise_and),
])
def test_every_program_combines_into_the_output(op, init, combine):
    x = (np.arange(4 * 8, dtype=np.int32).reshape(4, 8) * 7) % 23 - 5

    def kernel(x_ref, init_ref, o_ref):
        del init_ref  # aliased to the output
        op(o_ref, x_ref[0])

    f = pl.pallas_call(
        kernel, grid=(4,), out_shape=jax.ShapeDtypeStruct((8,), jnp.int32),
        in_specs=[pl.BlockSpec((1, 8), lambda i: (i, 0)), pl.BlockSpec((8,), lambda i: (0,))],
        out_specs=pl.BlockSpec((8,), lambda i: (0,)),
        input_output_aliases={1: 0}, interpret=True)
    out = jax.jit(lambda x: f(x, jnp.full((8,), init, jnp.int32)))(x)
    expected = np.full((8,), init, np.int32)
    for row in x:
        expected = combine(expected, row)
    np.testing.assert_array_equal(out, expected)


def test_value_shape_must_match_the_ref():
    def kernel(o_ref):
        plgpu.atomic_add(o_ref, jnp.ones((4,), jnp.float32))

    with pytest.raises(ValueError, match=r"val has shape \(4,\) but the ref has shape \(8,\)"):
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                       interpret=True)()
