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


def test_sync_copy_takes_pytrees_of_refs():
    """Upstream's sync_copy copies a pytree of refs (an empty one copies nothing)."""
    def kernel(a_hbm, b_hbm, o_a, o_b):
        pltpu.sync_copy(((), [], ()), ((), [], ()))
        pltpu.sync_copy({"a": a_hbm.at[0:8], "b": b_hbm}, {"a": o_a, "b": o_b})

    a, b = jnp.arange(16.0 * 128).reshape(16, 128), jnp.ones((8, 128), jnp.int32)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    oa, ob = pl.pallas_call(
        kernel, in_specs=[any_spec, any_spec], out_specs=[any_spec, any_spec],
        out_shape=[jax.ShapeDtypeStruct((8, 128), a.dtype),
                   jax.ShapeDtypeStruct(b.shape, b.dtype)])(a, b)
    np.testing.assert_array_equal(oa, a[:8])
    np.testing.assert_array_equal(ob, b)


def test_pl_kernel_lifts_captured_traced_scalars_into_smem():
    mesh = pltpu.create_tensorcore_mesh("x", num_cores=1)

    def f(x, i, j):
        def body(x_ref, out_ref):
            pltpu.sync_copy(x_ref.at[i + j], out_ref.at[jax.lax.axis_index("x")])

        return pl.kernel(body, mesh=mesh,
                         out_type=jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype))(x)

    x = jnp.arange(4 * 8 * 128, dtype=jnp.int32).reshape(4, 8, 128)
    for i, j in [(0, 1), (1, 2)]:
        np.testing.assert_array_equal(jax.jit(f)(x, i, j)[0], x[i + j])


def test_pl_kernel_reads_and_writes_refs_it_closes_over():
    mesh = pltpu.create_tensorcore_mesh("core")
    x = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128)

    @jax.jit
    def f(x):
        x_ref, o_ref = jax.new_ref(x), jax.empty_ref(jax.typeof(x))

        @pl.kernel(mesh=mesh, scratch_types=[pltpu.VMEM(x.shape, x.dtype)])
        def fn(tmp):
            pltpu.sync_copy(x_ref, tmp)
            tmp[...] += 1
            pltpu.sync_copy(tmp, o_ref)

        fn()
        return jax.freeze(o_ref)

    np.testing.assert_array_equal(f(x), x + 1)
