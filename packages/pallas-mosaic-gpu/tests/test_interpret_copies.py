"""GPU interpret mode: TMA copies run on simulated TMA units; reading their data
before the barrier (or ``wait_smem_to_gmem``) says so is a race."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu import interpret as gpu_interpret

IP = plgpu.InterpretParams
X = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)


@pytest.fixture(autouse=True)
def _fresh_state():
    gpu_interpret.reset_gpu_interpret_mode_state()
    yield


def races() -> bool:
    return gpu_interpret.get_races().races_found


@pytest.mark.parametrize("wait", [True, False])
def test_a_load_is_ordered_by_waiting_on_its_barrier(wait):
    def body(x_gmem, o_gmem, bar, smem):
        plgpu.copy_gmem_to_smem(x_gmem, smem, bar)
        if wait:
            plgpu.barrier_wait(bar)
        o_gmem[...] = smem[...]

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct.like(X),
                     scratch_types=dict(bar=plgpu.Barrier(), smem=plgpu.SMEM(X.shape, X.dtype)),
                     interpret=IP(detect_races=True))
    y = k(X)
    assert races() is not wait
    if wait:
        np.testing.assert_array_equal(y, X)


@pytest.mark.parametrize(("units", "race"), [(1, False), (2, True)])
def test_copies_on_different_tma_units_are_unordered(units, race):
    def body(a, b, o_gmem, bar, smem):
        plgpu.copy_gmem_to_smem(a, smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b, smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])
        o_gmem[...] = a[...] + b[...]

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct.like(X),
                     scratch_types=dict(bar=plgpu.Barrier(num_barriers=2),
                                        smem=plgpu.SMEM(X.shape, X.dtype)),
                     interpret=IP(detect_races=True, num_tma_threads_per_device=units))
    np.testing.assert_array_equal(k(X, 2 * X), 3 * X)
    assert races() is race


def test_stores_to_gmem_by_each_thread_of_each_block():
    def body(o_gmem, smem):
        t, i = jax.lax.axis_index("t"), jax.lax.axis_index("i")
        rows = pl.ds(i * 4, 4)
        smem[t, rows] = jnp.full((4, 16), t * 10 + i, jnp.int32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem.at[t, rows], o_gmem.at[t, rows])
        plgpu.wait_smem_to_gmem(0)

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 8, 16), jnp.int32),
                     grid=(2,), grid_names=("i",), num_threads=2, thread_name="t",
                     scratch_types=dict(smem=plgpu.SMEM((2, 8, 16), jnp.int32)),
                     interpret=IP(detect_races=True))
    y = np.asarray(jax.jit(k)())
    assert (y[1, 4:] == 11).all() and (y[0, :4] == 0).all()
    assert not races()


def test_a_store_with_a_reduction_combines_into_gmem():
    def body(x_gmem, o_gmem, smem):
        smem[...] = jnp.ones_like(smem)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem, reduction_op="add")
        plgpu.wait_smem_to_gmem(0)

    f = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct.like(X),
                       in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
                       out_specs=pl.BlockSpec(memory_space=plgpu.GMEM),
                       scratch_shapes=[plgpu.SMEM(X.shape, X.dtype)],
                       input_output_aliases={0: 0}, interpret=IP())
    np.testing.assert_array_equal(f(X), X + 1)


def test_copy_shapes_and_memory_spaces_are_checked_at_trace_time():
    def bad_shape(x_gmem, o_gmem, bar, smem):
        plgpu.copy_gmem_to_smem(x_gmem.at[0], smem, bar)

    def bad_space(x_gmem, o_gmem, bar, smem):
        plgpu.copy_gmem_to_smem(smem, x_gmem, bar)

    scratch = dict(bar=plgpu.Barrier(), smem=plgpu.SMEM(X.shape, X.dtype))
    for body, err, msg in [(bad_shape, ValueError, "same shape and dtype"),
                           (bad_space, TypeError, "src must be in GMEM, got SMEM")]:
        k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct.like(X),
                         scratch_types=scratch, interpret=IP())
        with pytest.raises(err, match=msg):
            k(X)


def test_reading_out_of_bounds_raises():
    def body(x_gmem, o_gmem):
        o_gmem[...] = x_gmem[pl.ds(jax.lax.axis_index("t") + 1, 2)]

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 8), jnp.int32),
                     num_threads=1, thread_name="t", interpret=IP())
    with pytest.raises(Exception, match="out-of-bounds read of"):
        k(X)


def test_a_cluster_barrier_synchronises_the_blocks_of_a_cluster():
    def body(o_gmem, bar):
        c = jax.lax.axis_index("c")
        o_gmem[c] = c + 1
        plgpu.barrier_arrive(bar)
        plgpu.barrier_wait(bar)
        o_gmem[2 + c] = o_gmem[1 - c] * 10  # reads the other block's write

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((4,), jnp.int32), cluster=(2,),
                     cluster_names=("c",),
                     scratch_types=dict(bar=plgpu.ClusterBarrier(collective_axes=("c",))),
                     interpret=IP(detect_races=True))
    np.testing.assert_array_equal(k(), [1, 2, 20, 10])
    assert not races()


def test_a_multicast_copy_lands_in_every_block_of_the_cluster():
    def body(x_gmem, o_gmem, bar, smem):
        c = jax.lax.axis_index("c")
        plgpu.copy_gmem_to_smem(x_gmem, smem, bar, collective_axes="c")
        plgpu.barrier_wait(bar)
        o_gmem[c] = smem[...]

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, *X.shape), X.dtype),
                     cluster=(2,), cluster_names=("c",),
                     scratch_types=dict(bar=plgpu.Barrier(), smem=plgpu.SMEM(X.shape, X.dtype)),
                     interpret=IP(detect_races=True))
    np.testing.assert_array_equal(k(X), jnp.stack([X, X]))
    assert not races()
