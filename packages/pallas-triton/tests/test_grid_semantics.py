"""Pallas' sequential grid on a GPU whose programs run in parallel.

An axis that no output's index map uses runs as a loop in each program, so revisits and
scratch accumulators along it behave as in the interpreter. What would need the whole
grid in order is rejected at lowering time, naming the backend and the alternative,
rather than computed differently; atomics are how programs share a block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_triton as pltriton
from pallas import atomics

SDS = jax.ShapeDtypeStruct
ROWS = pl.BlockSpec((8, 128), lambda i: (i, 0))
SHARED = pl.BlockSpec((8, 128), lambda i: (0, 0))


def _running_sum(x):
    """Scratch reset at program 0 and carried to the next output block."""
    def kernel(x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]
        o_ref[...] = acc_ref[...]

    return pl.pallas_call(kernel, out_shape=SDS(x.shape, x.dtype), grid=(4,),
                          in_specs=[ROWS], out_specs=ROWS,
                          scratch_shapes=[pl.ANY((8, 128), jnp.float32)])(x)


def test_scratch_carried_from_one_output_block_to_the_next_is_rejected():
    with pytest.raises(NotImplementedError,
                       match=r"scratch carried from one program.*pallas-triton.*pl\.when"):
        pltriton.inspect(_running_sum, jnp.ones((32, 128), jnp.float32))


def test_scratch_reset_at_the_first_step_of_a_reduction_axis_lowers_and_matches():
    def kernel(x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]

        @pl.when(pl.program_id(1) == 3)
        def _():
            o_ref[...] = acc_ref[...]

    f = pl.pallas_call(kernel, out_shape=SDS((16, 128), jnp.float32), grid=(2, 4),
                       in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, k))],
                       out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
                       scratch_shapes=[pl.ANY((8, 128), jnp.float32)])
    x = jnp.arange(16 * 512, dtype=jnp.float32).reshape(16, 512) % 7
    assert "for step1_" in pltriton.inspect(f, x)  # axis 1 is a loop in each program
    expected = np.asarray(x).reshape(16, 4, 128).sum(axis=1)
    np.testing.assert_array_equal(pltriton.emulate(f, x), expected)


def _shared_block_call(kernel, x):
    return pl.pallas_call(
        kernel, out_shape=(SDS((8, 128), x.dtype), SDS(x.shape, x.dtype)), grid=(4,),
        in_specs=[SHARED, ROWS], out_specs=(SHARED, ROWS), input_output_aliases={0: 0},
    )(jnp.zeros((8, 128), x.dtype), x)


def test_plain_accumulation_into_a_block_parallel_programs_share_is_rejected():
    def kernel(z_ref, x_ref, s_ref, y_ref):
        s_ref[...] += x_ref[...]  # would race on a GPU
        y_ref[...] = x_ref[...]

    with pytest.raises(NotImplementedError,
                       match=r"plain read of outputs\[0\].*grid axes 0.*pallas-triton.*atomics"):
        pltriton.inspect(lambda x: _shared_block_call(kernel, x), jnp.ones((32, 128)))


def test_atomics_into_a_block_parallel_programs_share_lower_and_match():
    def kernel(z_ref, x_ref, s_ref, y_ref):
        atomics.atomic_add(s_ref, (slice(None), slice(None)), x_ref[...])
        y_ref[...] = x_ref[...]

    f = lambda z, x: pl.pallas_call(  # noqa: E731
        kernel, out_shape=(SDS((8, 128), x.dtype), SDS(x.shape, x.dtype)), grid=(4,),
        in_specs=[SHARED, ROWS], out_specs=(SHARED, ROWS), input_output_aliases={0: 0},
    )(z, x)
    z, x = jnp.zeros((8, 128), jnp.int32), jnp.arange(32 * 128, dtype=jnp.int32).reshape(32, 128)
    src = pltriton.inspect(f, z, x)
    assert "tl.program_id(0)" in src and "for step" not in src  # parallel programs
    assert "tl.debug_barrier()\n    v" in src and "tl.atomic_add(" in src
    s, y = pltriton.emulate(f, z, x)
    np.testing.assert_array_equal(s, np.asarray(x).reshape(4, 8, 128).sum(axis=0))
    np.testing.assert_array_equal(y, x)


def test_pltriton_atomics_are_the_core_ones():
    assert pltriton.atomic_add is atomics.atomic_add
    assert pltriton.atomic_cas is atomics.atomic_cas
