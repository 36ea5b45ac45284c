"""Explicit MXU control (``matmul_push_rhs``/``matmul_acc_lhs``/``matmul_pop``): the
interpreter's staging and accumulator state, and the Mosaic ops they lower to."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_tpu as pltpu


def _call(kernel, out_shape, *args, interpret=True):
    return pl.pallas_call(kernel, out_shape=out_shape, interpret=interpret,
                          compiler_params=pltpu.CompilerParams())(*args)


def _k_split_matmul(x, y, interpret=True):
    """x @ y with K split in two halves: two RHSs staged, accumulated into one slice."""
    m, k = x.shape
    n = y.shape[1]
    h = k // 2

    def kernel(x_ref, y_ref, o_ref):
        pltpu.matmul_push_rhs(y_ref[:h, :], staging_register=0, mxu_index=0)
        pltpu.matmul_push_rhs(y_ref[h:, :], staging_register=1, mxu_index=0)
        pltpu.matmul_acc_lhs(0, x_ref[:, :h], mxu_index=0, load_staged_rhs=0)
        pltpu.matmul_acc_lhs(0, x_ref[:, h:], mxu_index=0, load_staged_rhs=1)
        o_ref[...] = pltpu.matmul_pop(0, (m, n), jnp.float32, mxu_index=0)

    return _call(kernel, jax.ShapeDtypeStruct((m, n), jnp.float32), x, y,
                 interpret=interpret)


def test_mxu_accumulates_over_staged_rhs(rng):
    x = jnp.asarray(rng.standard_normal((8, 512)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((512, 256)), jnp.float32)
    np.testing.assert_allclose(_k_split_matmul(x, y), x @ y, rtol=1e-4, atol=1e-3)


def test_mxu_reuse_loaded_rhs_transpose_two_mxus_and_pop_zeroes(rng):
    a = jnp.asarray(rng.standard_normal((16, 256)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((256, 256)), jnp.bfloat16)

    def kernel(a_ref, w_ref, o1, o2, o3, o4):
        pltpu.matmul_push_rhs(w_ref[...], 0, 0)
        pltpu.matmul_push_rhs(w_ref[...], 0, 1, transpose=True)
        pltpu.matmul_acc_lhs(0, a_ref[:8], 0, load_staged_rhs=0)
        pltpu.matmul_acc_lhs(8, a_ref[8:], 0)  # reuses the loaded RHS
        pltpu.matmul_acc_lhs(0, a_ref[...], 1, load_staged_rhs=0)
        o1[...] = pltpu.matmul_pop(0, (8, 256), jnp.float32, 0)
        o2[...] = pltpu.matmul_pop(8, (8, 256), jnp.float32, 0)
        o3[...] = pltpu.matmul_pop(0, (16, 256), jnp.float32, 1)
        o4[...] = pltpu.matmul_pop(0, (16, 256), jnp.float32, 1)  # popped: zeros

    shapes = [jax.ShapeDtypeStruct(s, jnp.float32)
              for s in ((8, 256), (8, 256), (16, 256), (16, 256))]
    o1, o2, o3, o4 = _call(kernel, shapes, a, w)
    ref = jnp.dot(a, w, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(o1, ref[:8], rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(o2, ref[8:], rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(o3, jnp.dot(a, w.T, preferred_element_type=jnp.float32),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(o4, 0)


def test_mxu_int8_accumulates_in_int32(rng):
    a = jnp.asarray(rng.integers(-100, 100, (8, 256)), jnp.int8)
    w = jnp.asarray(rng.integers(-100, 100, (256, 256)), jnp.int8)

    def kernel(a_ref, w_ref, o_ref):
        pltpu.matmul_push_rhs(w_ref[...], 0, 0)
        pltpu.matmul_acc_lhs(0, a_ref[...], 0, load_staged_rhs=0)
        pltpu.matmul_acc_lhs(0, a_ref[...], 0)
        o_ref[...] = pltpu.matmul_pop(0, (8, 256), jnp.int32, 0)

    out = _call(kernel, jax.ShapeDtypeStruct((8, 256), jnp.int32), a, w)
    np.testing.assert_array_equal(out, 2 * jnp.dot(a, w, preferred_element_type=jnp.int32))


def test_mxu_inside_one_loop_body(rng):
    x = jnp.asarray(rng.standard_normal((8, 256)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((256, 256)), jnp.float32)

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        def body(i, c):
            pltpu.matmul_push_rhs(w_ref[...] * (i + 1).astype(jnp.float32), 0, 0)
            pltpu.matmul_acc_lhs(0, x_ref[...], 0, load_staged_rhs=0)
            o_ref[...] += pltpu.matmul_pop(0, (8, 256), jnp.float32, 0)
            return c

        jax.lax.fori_loop(0, 3, body, 0)

    out = _call(kernel, jax.ShapeDtypeStruct((8, 256), jnp.float32), x, w)
    np.testing.assert_allclose(out, 6 * (x @ w), rtol=1e-4, atol=1e-2)


def _run_expect(kernel, exc, match):
    x = jnp.ones((8, 256), jnp.float32)
    with pytest.raises(exc, match=match):
        _call(kernel, jax.ShapeDtypeStruct((8, 256), jnp.float32), x)


def test_mxu_misuse_is_reported():
    def push_twice(x_ref, o_ref):
        pltpu.matmul_push_rhs(jnp.ones((256, 256)), 0, 0)
        pltpu.matmul_push_rhs(jnp.ones((256, 256)), 0, 0)

    _run_expect(push_twice, ValueError, "already holds an RHS")

    def no_rhs(x_ref, o_ref):
        pltpu.matmul_acc_lhs(0, x_ref[...], 0)

    _run_expect(no_rhs, ValueError, "no RHS loaded")

    def empty_register(x_ref, o_ref):
        pltpu.matmul_acc_lhs(0, x_ref[...], 0, load_staged_rhs=3)

    _run_expect(empty_register, ValueError, "register 3 of MXU 0 is empty")

    def across_scopes(x_ref, o_ref):
        pltpu.matmul_push_rhs(jnp.ones((256, 256)), 0, 0)

        def body(i, c):
            pltpu.matmul_acc_lhs(0, x_ref[...], 0, load_staged_rhs=0)
            return c

        jax.lax.fori_loop(0, 2, body, 0)

    _run_expect(across_scopes, NotImplementedError, "different control-flow scope")

    with pytest.raises(TypeError, match="load_staged_rhs"):
        pltpu.matmul_acc_lhs(0, jnp.ones((8, 256)), 0, load_staged_rhs=True)
    with pytest.raises(ValueError, match="float32 and int32"):
        jax.make_jaxpr(lambda: pltpu.matmul_pop(0, (8, 256), jnp.bfloat16, 0))()


def test_mxu_lowering(lower_tpu, ops):
    x = jnp.zeros((8, 512), jnp.float32)
    y = jnp.zeros((512, 256), jnp.float32)
    _, (m,) = lower_tpu(lambda a, b: _k_split_matmul(a, b, interpret=False), x, y)
    names = collections.Counter(ops(m))
    assert names["tpu.matmul_push_rhs"] == 2
    assert names["tpu.matmul_acc_lhs"] == 2
    assert names["tpu.matmul_pop"] == 1
    text = str(m)
    assert "load_staged_rhs = 1" in text and "staging_register = 1" in text
