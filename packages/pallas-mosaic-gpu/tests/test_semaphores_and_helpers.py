"""Semaphores count as in pallas-core (memory_scope is checked); find_swizzle's choice;
layout descriptions (reduced layouts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas.plugins import is_semaphore_space


@pytest.mark.parametrize("minor_bits,swizzle", [
    (64 * 16, 128), (32 * 16, 64), (16 * 16, 32), (8 * 16, 16), (3 * 128 * 8, 128),
    (96 * 8, 32),  # 96 bytes: 32 divides it, 64 does not
])
def test_find_swizzle_picks_the_largest_that_divides(minor_bits, swizzle):
    assert plgpu.find_swizzle(minor_bits) == swizzle


def test_find_swizzle_rejects_dims_under_16_bytes():
    with pytest.raises(ValueError, match="for lhs: minor dimension has 72 bits"):
        plgpu.find_swizzle(72, "lhs")


def test_semaphore_type_makes_semaphore_scratch():
    s = plgpu.SemaphoreType.REGULAR((2,))
    assert s.shape == (2,) and s.dtype == jnp.int32
    assert is_semaphore_space(s.memory_space)
    assert plgpu.SemaphoreType.BARRIER(()).memory_space != s.memory_space


def test_semaphore_signal_and_wait_count_in_a_kernel():
    def kernel(o_ref, sem):
        plgpu.semaphore_signal(sem, 3, memory_scope="gpu")
        plgpu.semaphore_wait(sem, 2)
        o_ref[0] = pl.semaphore_read(sem)

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
        scratch_shapes=[plgpu.SemaphoreType.REGULAR(())], interpret=True)()
    np.testing.assert_array_equal(out, [1])


def test_a_bare_semaphore_type_is_one_semaphore_of_kernel_scratch():
    """``scratch_types=[plgpu.SemaphoreType.REGULAR]`` (no shape), as upstream's
    multi-device kernels write it: one semaphore per block, starting at zero."""

    def kernel(o_ref, sem):
        plgpu.semaphore_signal(sem, 3)
        plgpu.semaphore_wait(sem, 1)
        o_ref[lax.axis_index("b")] = pl.semaphore_read(sem)

    out = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((2,), jnp.int32), grid=(2,),
                       grid_names=("b",), scratch_types=[plgpu.SemaphoreType.REGULAR],
                       interpret=True)()
    np.testing.assert_array_equal(out, [2, 2])


def test_memory_scope_is_checked():
    def kernel(o_ref, sem):
        plgpu.semaphore_signal(sem, memory_scope="cta")

    with pytest.raises(ValueError, match="memory_scope='cta'.*'sys', 'gpu'"):
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                       scratch_shapes=[plgpu.SemaphoreType.REGULAR(())], interpret=True)()


def test_a_reduced_layout_names_the_layout_and_the_axes_reduced_away():
    """``Layout.WGMMA.reduce(1)``, as upstream's attention kernel writes its row
    statistics; a layout cast to it changes no value."""
    row = plgpu.Layout.WGMMA.reduce(1)
    assert row == plgpu.Layout.WGMMA.reduce((1,)) and row.axes == (1,)
    assert row.layout is plgpu.Layout.WGMMA
    x = jnp.arange(64, dtype=jnp.float32)
    np.testing.assert_array_equal(jax.jit(lambda v: plgpu.layout_cast(v, row))(x), x)


def test_get_global_is_one_semaphore_shared_by_every_block_of_a_launch():
    """``pl.get_global(plgpu.SemaphoreType.REGULAR)``: allocated once per launch (zero at
    its start), the same for all blocks; each block signals it and waits for all."""

    def kernel(o_ref):
        sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
        plgpu.semaphore_signal(sem)
        plgpu.semaphore_wait(sem, 4, decrement=False)
        o_ref[lax.axis_index("b")] = pl.semaphore_read(sem)

    run = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((4,), jnp.int32), grid=(4,),
                       grid_names=("b",), interpret=True)
    np.testing.assert_array_equal(run(), [4, 4, 4, 4])
    np.testing.assert_array_equal(run(), [4, 4, 4, 4])  # a new launch starts at zero


def test_get_global_takes_a_buffer_type():
    def kernel(o_ref):
        pl.get_global((4,))

    with pytest.raises(TypeError, match=r"pl.get_global\(what=\(4,\)\).*SemaphoreType"):
        plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((1,), jnp.int32),
                     interpret=True)()
