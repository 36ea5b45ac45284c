"""``pl.kernel`` on a TensorCore mesh with refs made outside it (upstream's
tpu_pallas_mpmd_test idiom): DMAs read and write the refs in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
import pallas_tpu as pltpu


def test_sync_copy_between_refs_passed_to_pl_kernel():
    mesh = pltpu.create_tensorcore_mesh("core")
    x = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128)

    @jax.jit
    def f(x):
        x_ref = jax.new_ref(x)
        o_ref = jax.empty_ref(jax.typeof(x))
        pl.kernel(body=pltpu.sync_copy, mesh=mesh)(x_ref, o_ref)
        return jax.freeze(o_ref)

    np.testing.assert_array_equal(f(x), x)


def test_refs_and_scratch_in_pl_kernel():
    mesh = pltpu.create_tensorcore_mesh("core")
    x, y = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128), jnp.zeros((8, 128), jnp.int32)

    @jax.jit
    def f(x, y):
        x_ref, y_ref = jax.new_ref(x), jax.new_ref(y)

        def body(x_ref, y_ref, sx, sy):
            pltpu.sync_copy(x_ref, sx)
            pltpu.sync_copy(y_ref, sy)
            pltpu.sync_copy(sx, y_ref)
            pltpu.sync_copy(sy, x_ref)

        pl.kernel(body, mesh=mesh, out_type=(),
                  scratch_types=[pltpu.VMEM((8, 128), jnp.int32)] * 2)(x_ref, y_ref)
        return jax.freeze(x_ref), jax.freeze(y_ref)

    x2, y2 = f(x, y)
    np.testing.assert_array_equal(x2, y)
    np.testing.assert_array_equal(y2, x)
