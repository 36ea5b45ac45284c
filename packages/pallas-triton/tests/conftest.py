"""A small catalogue of kernels that the tests lower, compile and emulate.

Each case is ``make(interpret) -> (f, args)``; ``f(*args)`` makes exactly one
``pallas_call``. With ``interpret=True`` it runs pallas-core's interpreter, the reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas_triton as pltriton

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def _rand(shape, dtype=jnp.float32, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return jnp.asarray(x, dtype)


@case
def elementwise(interpret):
    def kernel(x_ref, y_ref, o_ref):
        x, y = x_ref[...], y_ref[...]
        a = jnp.exp(x) * jnp.sin(y) - jnp.cos(x) / (1.0 + jnp.abs(y))
        b = jnp.tanh(x) + jnp.sqrt(jnp.abs(y)) + lax.rsqrt(1.0 + x * x) + jnp.log(1 + y * y)
        c = jnp.maximum(x, y) - jnp.minimum(x, -y) + jnp.where(x > y, x, -y)
        d = jnp.power(jnp.abs(x) + 1.0, 1.5) + (-x) + x.astype(jnp.bfloat16).astype(jnp.float32)
        o_ref[...] = a + b + c + d

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32), grid=(2, 2),
        in_specs=[pl.BlockSpec((32, 64), lambda i, j: (i, j))] * 2,
        out_specs=pl.BlockSpec((32, 64), lambda i, j: (i, j)), interpret=interpret)
    return f, (_rand((64, 128)), _rand((64, 128), seed=1))


@case
def integer_ops(interpret):
    def kernel(x_ref, y_ref, o_ref):
        x, y = x_ref[...], y_ref[...]
        o_ref[...] = (x // y) + (x % y) * 3 + (x & 7) - (x >> 1) + (x ^ y) + jnp.where(
            x < y, 1, 0)

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256,), jnp.int32),
                       interpret=interpret)
    x = jnp.arange(256, dtype=jnp.int32) - 100
    y = jnp.arange(256, dtype=jnp.int32) % 7 + 1
    return f, (x, y)


@case
def edge_blocks(interpret):
    # 100 is not a multiple of 32: the last block is masked on load and store.
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((100, 16), jnp.float32), grid=(4,),
        in_specs=[pl.BlockSpec((32, 16), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((32, 16), lambda i: (i, 0)), interpret=interpret)
    return f, (_rand((100, 16)),)


@case
def reductions(interpret):
    def kernel(x_ref, s_ref, m_ref, n_ref, a_ref):
        x = x_ref[...]
        s_ref[...] = jnp.sum(x, axis=1)
        m_ref[...] = jnp.max(x, axis=0)
        n_ref[...] = jnp.broadcast_to(jnp.min(x), (8,))
        a_ref[...] = jnp.argmax(x, axis=1).astype(jnp.int32)

    f = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((32,), jnp.float32),
                   jax.ShapeDtypeStruct((64,), jnp.float32),
                   jax.ShapeDtypeStruct((8,), jnp.float32),
                   jax.ShapeDtypeStruct((32,), jnp.int32)),
        interpret=interpret)
    return f, (_rand((32, 64)),)


@case
def softmax(interpret):
    def kernel(x_ref, o_ref):
        x = x_ref[...]
        m = jnp.max(x, axis=-1, keepdims=True)
        e = jnp.exp(x - m)
        o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32), grid=(4,),
        in_specs=[pl.BlockSpec((16, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((16, 128), lambda i: (i, 0)), interpret=interpret)
    return f, (_rand((64, 128)),)


@case
def matmul(interpret):
    bm, bn, bk = 32, 32, 16
    m, n, k = 64, 64, 64

    def kernel(a_ref, b_ref, o_ref):
        def body(kk, acc):
            a = a_ref[:, pl.ds(kk * bk, bk)]
            b = b_ref[pl.ds(kk * bk, bk), :]
            return acc + jnp.dot(a, b, preferred_element_type=jnp.float32)

        acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
        o_ref[...] = acc.astype(o_ref.dtype)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret=interpret,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=4))
    return f, (_rand((m, k), jnp.bfloat16), _rand((k, n), jnp.bfloat16, seed=1))


@case
def matmul_k_grid(interpret):
    # K is a grid axis the output ignores: the Triton kernel loops over it in-program.
    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((64, 64), jnp.bfloat16), grid=(2, 2, 3),
        in_specs=[pl.BlockSpec((32, 32), lambda i, j, k: (i, k)),
                  pl.BlockSpec((32, 32), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((32, 32), lambda i, j, k: (i, j)),
        scratch_shapes=[pl.ANY((32, 32), jnp.float32)], interpret=interpret)
    return f, (_rand((64, 96), jnp.bfloat16), _rand((96, 64), jnp.bfloat16, seed=1))


@case
def control_flow(interpret):
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        x = x_ref[...]

        def cond(c):
            return c[0] < 5

        def body(c):
            return c[0] + 1, c[1] * 1.5

        _, y = lax.while_loop(cond, body, (jnp.int32(0), x))
        y = lax.cond(i % 2 == 0, lambda v: v + 100.0, lambda v: v - 100.0, y)
        o_ref[...] = y

        @pl.when(i == 1)
        def _():
            o_ref[0:4] = jnp.zeros((4,), jnp.float32)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32,), jnp.float32), grid=(4,),
        in_specs=[pl.BlockSpec((8,), lambda i: (i,))],
        out_specs=pl.BlockSpec((8,), lambda i: (i,)), interpret=interpret)
    return f, (_rand((32,)),)


@case
def masked_load_store(interpret):
    def kernel(x_ref, o_ref):
        idx = jnp.arange(16)
        row = pl.load(x_ref, (pl.ds(pl.program_id(0), 1), slice(None)), mask=(idx < 10)[None],
                      other=-1.0)
        o_ref[...] = jnp.zeros_like(o_ref)
        pl.store(o_ref, (pl.ds(0, 1), slice(None)), row * 2.0, mask=(idx % 2 == 0)[None])

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((4, 16), jnp.float32), grid=(4,),
        in_specs=[pl.BlockSpec((4, 16), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((1, 16), lambda i: (i, 0)), interpret=interpret)
    return f, (_rand((4, 16)),)


@case
def iota_broadcast_scratch(interpret):
    def kernel(x_ref, o_ref, acc_ref):
        acc_ref[...] = jnp.zeros_like(acc_ref)
        r = lax.broadcasted_iota(jnp.int32, (16, 32), 0)
        c = lax.broadcasted_iota(jnp.int32, (16, 32), 1)

        def body(t, carry):
            acc_ref[...] += x_ref[...] * t.astype(jnp.float32)
            return carry

        lax.fori_loop(0, 3, body, 0)
        o_ref[...] = acc_ref[...] + (r * 32 + c).astype(jnp.float32) + x_ref[0, 0]

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((16, 32), jnp.float32),
        scratch_shapes=[pl.ANY((16, 32), jnp.float32)], interpret=interpret)
    return f, (_rand((16, 32)),)


@case
def grid_4d(interpret):
    # Four grid axes: collapsed into Triton's axis 0 and decoded in the kernel.
    def kernel(x_ref, o_ref):
        total = (pl.program_id(0) * 1000 + pl.program_id(1) * 100 + pl.program_id(2) * 10
                 + pl.program_id(3))
        o_ref[...] = x_ref[...] + total.astype(jnp.float32) + pl.num_programs(3)

    spec = pl.BlockSpec((None, None, 2, 8), lambda a, b, c, d: (a, b, c, d))
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 3, 4, 16), jnp.float32),
                       grid=(2, 3, 2, 2), in_specs=[spec], out_specs=spec,
                       interpret=interpret)
    return f, (_rand((2, 3, 4, 16)),)


@case
def layer_norm_bf16(interpret):
    def kernel(x_ref, w_ref, o_ref):
        x = x_ref[...].astype(jnp.float32)
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        y = (x - mu) * lax.rsqrt(var + 1e-5) * w_ref[...]
        o_ref[...] = y.astype(o_ref.dtype) + jax.nn.gelu(y).astype(o_ref.dtype)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32, 64), jnp.bfloat16), grid=(2,),
        in_specs=[pl.BlockSpec((16, 64), lambda i: (i, 0)),
                  pl.BlockSpec((64,), lambda i: (0,))],
        out_specs=pl.BlockSpec((16, 64), lambda i: (i, 0)), interpret=interpret)
    return f, (_rand((32, 64), jnp.bfloat16), jnp.linspace(0.0, 1.0, 64))


@case
def flash_attention(interpret):
    bq, bk, d, seq = 32, 16, 32, 64

    def kernel(q_ref, k_ref, v_ref, o_ref):
        q = q_ref[...]

        def body(i, carry):
            m, l, acc = carry
            kb = k_ref[pl.ds(i * bk, bk), :]
            vb = v_ref[pl.ds(i * bk, bk), :]
            s = jnp.dot(q, kb.T, preferred_element_type=jnp.float32)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.exp(s - m_new[:, None])
            alpha = jnp.exp(m - m_new)
            l = l * alpha + p.sum(axis=-1)
            acc = acc * alpha[:, None] + jnp.dot(p.astype(vb.dtype), vb,
                                                 preferred_element_type=jnp.float32)
            return m_new, l, acc

        init = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
                jnp.zeros((bq, d), jnp.float32))
        _, l, acc = lax.fori_loop(0, seq // bk, body, init)
        o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)

    full = pl.BlockSpec((seq, d), lambda i: (0, 0))
    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((seq, d), jnp.bfloat16), grid=(seq // bq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0)), full, full],
        out_specs=pl.BlockSpec((bq, d), lambda i: (i, 0)), interpret=interpret)
    q = _rand((seq, d), jnp.bfloat16)
    return f, (q, _rand((seq, d), jnp.bfloat16, seed=1), _rand((seq, d), jnp.bfloat16, seed=2))


@case
def atomics(interpret):
    def kernel(x_ref, s_ref, m_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            s_ref[...] = jnp.zeros_like(s_ref)
            m_ref[...] = jnp.full(m_ref.shape, -1, jnp.int32)

        x = x_ref[...]
        pltriton.atomic_add(s_ref, (slice(None),), x.astype(jnp.float32))
        pltriton.atomic_max(m_ref, (pl.ds(0, 16),), x, mask=jnp.arange(16) % 3 == 0)

    spec = pl.BlockSpec((16,), lambda i: (0,))
    f = pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((16,), jnp.float32),
                           jax.ShapeDtypeStruct((16,), jnp.int32)), grid=(4,),
        in_specs=[pl.BlockSpec((16,), lambda i: (i,))], out_specs=(spec, spec),
        interpret=interpret)
    return f, ((jnp.arange(64, dtype=jnp.int32) * 7) % 23,)


def pytest_generate_tests(metafunc):
    if "case_name" in metafunc.fixturenames:
        metafunc.parametrize("case_name", sorted(CASES))


@pytest.fixture
def make_case():
    """``make_case(name, interpret)`` -> ``(f, args)`` for a catalogue case."""
    return lambda name, interpret: CASES[name](interpret)


@pytest.fixture
def reference():
    """``reference(name)``: the case's outputs from pallas-core's interpreter."""

    @functools.cache
    def run(name):
        f, args = CASES[name](True)
        return jax.tree_util.tree_map(np.asarray, f(*args))

    return run
