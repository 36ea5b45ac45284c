"""Refs made outside a kernel (``jax.new_ref``/``jax.empty_ref``) as ``pallas_call`` and
``pl.kernel`` operands: the kernel reads and writes them in place, as upstream."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def test_a_kernel_writes_into_a_ref_operand():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)

    @jax.jit
    def f(x):
        o_ref = jax.empty_ref(jax.typeof(x))
        pl.pallas_call(copy_kernel, out_shape=(), interpret=True)(x, o_ref)
        return jax.freeze(o_ref)

    np.testing.assert_array_equal(f(x), x)


def test_ref_operands_mixed_with_outputs_and_blocks():
    """A read-and-written ref beside a plain input and an output, over a blocked grid."""
    def kernel(x_ref, acc_ref, o_ref):
        acc_ref[...] += x_ref[...]
        o_ref[...] = acc_ref[...] * 2

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))

    @jax.jit
    def f(x, acc):
        acc_ref = jax.new_ref(acc)
        out = pl.pallas_call(kernel, grid=(2,), in_specs=[spec, spec], out_specs=spec,
                             out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                             interpret=True)(x, acc_ref)
        return out, jax.freeze(acc_ref)

    x, acc = jnp.ones((16, 128)), jnp.full((16, 128), 3.0)
    out, acc_after = f(x, acc)
    np.testing.assert_array_equal(acc_after, 4.0)
    np.testing.assert_array_equal(out, 8.0)


def test_two_refs_swap_through_scratch():
    def body(x_ref, y_ref, sx, sy):
        sx[...] = x_ref[...]
        sy[...] = y_ref[...]
        y_ref[...] = sx[...]
        x_ref[...] = sy[...]

    x, y = jnp.arange(8.0 * 128).reshape(8, 128), jnp.zeros((8, 128))

    @jax.jit
    def f(x, y):
        x_ref, y_ref = jax.new_ref(x), jax.new_ref(y)
        pl.pallas_call(body, out_shape=(), interpret=True,
                       scratch_shapes=[pl.ANY((8, 128), jnp.float32)] * 2,
                       )(x_ref, y_ref)
        return jax.freeze(x_ref), jax.freeze(y_ref)

    x2, y2 = f(x, y)
    np.testing.assert_array_equal(x2, y)
    np.testing.assert_array_equal(y2, x)


def test_a_ref_cannot_also_be_aliased():
    @jax.jit
    def f(x):
        o_ref = jax.new_ref(x)
        pl.pallas_call(copy_kernel, out_shape=(), input_output_aliases={1: 0},
                       interpret=True)(x, o_ref)
        return jax.freeze(o_ref)

    with pytest.raises(ValueError, match="is a Ref and also in input_output_aliases"):
        f(jnp.ones((8, 128)))


def test_a_pallas_call_kernel_closing_over_refs_updates_them_in_place():
    # upstream's tpu_pallas_state_test: refs of pl.run_state (or jax.new_ref) that a
    # pallas_call body closes over become whole-ref operands, read and written in place,
    # also under a grid.
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(4 * 8, 128)

    def stateful(refs):
        x_ref, y_ref = refs

        def kernel(o_ref):
            i = pl.program_id(0)
            rows = pl.ds(i * 8, 8)
            y_ref[rows, :] = x_ref[rows, :] * 2.0
            o_ref[...] = x_ref[rows, :] + 1.0

        out = pl.pallas_call(kernel, grid=(4,), out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                             out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)()
        y_ref[...] += out

    _, y = jax.jit(pl.run_state(stateful))((x, jnp.zeros_like(x)))
    np.testing.assert_array_equal(y, x * 3.0 + 1.0)


def test_a_captured_array_is_still_refused_naming_it():
    x = jnp.ones((8, 128), jnp.float32)

    @jax.jit
    def f(x):
        y = x * 2.0

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + y

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x)

    with pytest.raises(ValueError, match=r"captures constants \[float32\[8,128\]\]: a kernel "
                                         r"captures non-Ref constants only as concrete"):
        f(x)


def test_captured_refs_with_scalar_prefetch_operands():
    # The prefetch operands take no BlockSpec: the captured refs' specs follow the
    # regular inputs only (upstream's test_basic_stateful_kernel_with_scalar_prefetch).
    x = jnp.arange(2 * 8 * 128, dtype=jnp.float32).reshape(2, 8, 128)

    def stateful(refs):
        x_ref, y_ref = refs

        def kernel(idx_ref):
            y_ref[...] = x_ref[idx_ref[0]] * 2.0

        pl.pallas_call(kernel, grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1),
                       out_shape=[], interpret=True)(jnp.array([1], jnp.int32))

    _, y = jax.jit(pl.run_state(stateful))((x, jnp.zeros_like(x[0])))
    np.testing.assert_array_equal(y, x[1] * 2.0)
