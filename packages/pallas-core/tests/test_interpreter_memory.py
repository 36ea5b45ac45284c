"""The interpreter's trace-time memory does not grow with the number of programs.

Index tables are built only over the grid axes an index map reads (and not at all past
a bound), so lowering a grid of 10**9 programs costs what lowering a grid of one does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct

# Runs in a child with its data segment capped at 2 GiB, so that a regression fails with
# a MemoryError instead of allocating the 7.45 GiB (10**9, 1) table on a shared machine.
_LOWER_A_BILLION_PROGRAMS = textwrap.dedent("""
    import resource, tracemalloc
    import jax, jax.numpy as jnp, pallas as pl
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
    f = pl.pallas_call(kernel, SDS((8, 128), jnp.float32), grid=(10**9,),
                       in_specs=[spec], out_specs=spec, interpret=True)
    tracemalloc.start()
    jax.jit(f).lower(jnp.zeros((8, 128), jnp.float32))
    print(tracemalloc.get_traced_memory()[1])
""").replace("SDS(", "jax.ShapeDtypeStruct(")


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_DATA bounds heap use on Linux")
def test_lowering_a_grid_of_a_billion_programs_takes_bounded_memory():
    r = subprocess.run([sys.executable, "-c", _LOWER_A_BILLION_PROGRAMS],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    peak = int(r.stdout.split()[-1])
    assert peak < 512 << 20, f"lowering took {peak / 2**20:.0f} MiB of Python/numpy memory"


def test_index_maps_that_ignore_a_huge_axis_still_vectorise_the_others():
    # The block moves along axis 1 only: its table has 4 rows however long axis 0 is,
    # and the result is the same as on a short grid.
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def call(n0):
        spec = pl.BlockSpec((8, 128), lambda i, j: (0, j))
        return pl.pallas_call(kernel, SDS((8, 512), jnp.float32), grid=(n0, 4),
                              in_specs=[spec], out_specs=spec, interpret=True)

    x = jnp.arange(8 * 512, dtype=jnp.float32).reshape(8, 512)
    jax.jit(call(10**9)).lower(x)  # the table is (1, 4, 2), not (4 * 10**9, 2)
    np.testing.assert_array_equal(call(3)(x), x * 2.0)


def test_out_of_bounds_block_is_reported_at_its_first_grid_point():
    # The map reads axis 1 only; the first failing point has axis 0 at 0.
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i, j: (0, j))
    f = pl.pallas_call(kernel, SDS((8, 256), jnp.float32), grid=(10**9, 3),
                       in_specs=[spec], out_specs=spec, interpret=True)
    with pl.enable_bounds_checks(True):
        with pytest.raises(IndexError, match=r"at grid iteration \(0, 2\)"):
            jax.jit(f).lower(jnp.zeros((8, 256), jnp.float32))
