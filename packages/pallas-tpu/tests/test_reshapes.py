"""Value reshapes in Mosaic TPU kernels: the rule accepts what libtpu compiles (per
chip), refuses the rest at trace time naming shapes, dtype and chip, and the executor
runs the accepted ones as row-major reshapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu
from pallas.plugins import KernelRequest
from pallas_conformance import pallas_call_eqns
from pallas_tpu import compiler
from pallas_tpu._src.backend import MOSAIC_TPU
from pallas_tpu._src.enums import LoweringException
from pallas_tpu._src.lowering.reshapes import why_not

BF16, I8 = jnp.bfloat16, jnp.int8

# (src, dst, dtype): each family of the rule, from upstream's tpu_pallas_test reshapes,
# its ragged paged attention kernel and issue 27; all compiled by libtpu for v5e and v6e.
ACCEPTED = [
    ((8, 128), (8, 2, 64), jnp.float32),          # split the lane dim (issue 27)
    ((2, 8, 64), (16, 64), jnp.float32),          # merge into a sublane-aligned dim
    ((64, 4, 128), (256, 128), BF16),             # ragged paged attention's fold
    ((9, 63), (63, 9), jnp.float8_e4m3fn),        # small last dims swapped
    ((3, 8, 17, 500), (3, 68000), I8),            # fold three minor dims, unaligned
    ((1, 3, 7680), (3, 10, 768), jnp.uint32),     # unfold with the leading dims changing
    ((9, 256), (2304,), BF16),                    # fold to rank 1
    ((200, 1), (200,), I8),                       # drop a unit minor dim
    ((32, 128), (1, 4096), jnp.float8_e4m3fn),    # float8 folds as int8 does
]
REFUSED = [
    ((8, 64, 2), (16, 64), jnp.float32),          # libtpu: unsupported shape cast
    ((1, 9, 384), (3456,), jnp.float32),          # fold to rank 1 of a 384 last dim
    ((3, 17), (17, 3), jnp.int32),                # swap where 17 % 3 != 0
    ((1024,), (64, 16), I8),                      # 64 rows of 16 lanes
]


def _reshape_call(dst, dtype, chip=None):
    params = pltpu.CompilerParams(chip=chip) if chip else None

    def f(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...].reshape(o_ref.shape)

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(dst, dtype),
                              backend="mosaic_tpu", compiler_params=params)(x)

    return f


@pytest.mark.parametrize("src,dst,dtype", ACCEPTED)
def test_the_rule_accepts_what_libtpu_compiles(src, dst, dtype):
    assert why_not(src, dst, dtype, None) is None


@pytest.mark.parametrize("src,dst,dtype", REFUSED)
def test_the_rule_refuses_what_libtpu_rejects(src, dst, dtype):
    assert why_not(src, dst, dtype, "v6e") is not None


def test_a_unit_minor_dim_on_a_packed_type_needs_v6e():
    assert why_not((200,), (200, 1), jnp.float32, "v5e") is None
    assert why_not((200,), (200, 1), BF16, "v6e") is None
    assert why_not((200,), (200, 1), BF16, "v5e") is not None
    assert why_not((200,), (200, 1), I8, None) is not None  # no chip: v5e's rule


def test_tpu_v4_relayouts_fewer_shapes():
    assert why_not((9, 63), (63, 9), I8, "v5e") is None
    assert why_not((9, 63), (63, 9), I8, "v4") is not None
    assert why_not((3, 400), (3, 2, 200), jnp.float32, "v4") is not None
    assert why_not((2, 8, 64), (16, 64), jnp.float32, "v4") is None
    assert why_not((5, 1024), (5, 4, 256), BF16, "v4") is None


def test_a_refused_reshape_is_a_lowering_error_naming_shapes_dtype_and_chip(lower_tpu):
    x = jax.ShapeDtypeStruct((200,), BF16)
    with pytest.raises(LoweringException, match=r"reshape.*\(200,\) to \(200, 1\) of "
                                                r"bfloat16 on TPU v5e.*v6e or later"):
        lower_tpu(_reshape_call((200, 1), BF16, chip="v5e"), x)
    lower_tpu(_reshape_call((200, 1), BF16, chip="v6e"), x)  # v6e inserts it
    with pytest.raises(LoweringException, match=r"\(8, 64, 2\) to \(16, 64\) of float32 "
                                                r"on TPU \(no chip named at lowering: v5e"):
        lower_tpu(_reshape_call((16, 64), jnp.float32),
                  jax.ShapeDtypeStruct((8, 64, 2), jnp.float32))


@pytest.mark.parametrize("src,dst,dtype", ACCEPTED[:6])
def test_the_executor_runs_accepted_reshapes_in_row_major_order(src, dst, dtype):
    x = (np.arange(np.prod(src)) % 97).astype(dtype).reshape(src)
    f = _reshape_call(dst, dtype)
    (eqn,) = pallas_call_eqns(jax.make_jaxpr(f)(x))
    request = KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    (out,) = MOSAIC_TPU.emulate(request, x)
    np.testing.assert_array_equal(np.asarray(out), x.reshape(dst))


def _split_swap_merge(x):
    """Issue 27: (8, 128) -> (8, 2, 64) -> swapaxes -> (16, 64)."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.swapaxes(x_ref[...].reshape(8, 2, 64), 0, 1).reshape(16, 64)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 64), x.dtype),
                          backend="mosaic_tpu")(x)


def test_a_transpose_of_major_and_sublane_dims_runs_in_the_executor():
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    (eqn,) = pallas_call_eqns(jax.make_jaxpr(_split_swap_merge)(x))
    request = KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    (out,) = MOSAIC_TPU.emulate(request, x)
    np.testing.assert_array_equal(np.asarray(out),
                                  x.reshape(8, 2, 64).swapaxes(0, 1).reshape(16, 64))


@pytest.mark.skipif(not compiler.libtpu_available(),
                    reason="libtpu is not installed (pallas-tpu[compile])")
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_libtpu_compiles_the_accepted_families(chip):
    for src, dst, dtype in ACCEPTED[:3]:
        (k,) = pltpu.compile(_reshape_call(dst, dtype), jax.ShapeDtypeStruct(src, dtype),
                             chip=chip)
        assert k.chip == chip
    (k,) = pltpu.compile(_split_swap_merge, jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         chip=chip)
    assert k.chip == chip
