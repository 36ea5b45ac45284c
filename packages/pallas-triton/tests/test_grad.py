"""Reverse mode on Triton: kernels with loops get backward kernels that this backend
lowers (a loop's per-iteration residuals are stacked rows, of any length), and the
generated code gives the reference gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas.plugins
import pallas_triton as pltriton
from pallas.plugins import KernelRequest

SDS = jax.ShapeDtypeStruct
TOL = dict(rtol=2e-5, atol=2e-5)


def _normal(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * 0.5, jnp.float32)


def _emulated(f, *args):
    """``f(*args)`` with every ``pallas_call`` run as Triton's generated code (the
    backward kernels included)."""
    closed = jax.make_jaxpr(f)(*args)
    triton = pallas.plugins.get_backend("triton")
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))

    def read(v):
        return v.val if isinstance(v, jax.extend.core.Literal) else env[v]

    for e in closed.jaxpr.eqns:
        ins = [read(v) for v in e.invars]
        if e.primitive is pl.pallas_call_p:
            req = KernelRequest.from_params(e.params, e.params["compiler_params"])
            outs = [jnp.asarray(o) for o in triton.emulate(req, *ins)]
        else:
            assert not list(jax.extend.core.jaxprs_in_params(e.params)), e.primitive
            outs = e.primitive.bind(*ins, **e.params)
            outs = outs if e.primitive.multiple_results else [outs]
        env.update(zip(e.outvars, outs))
    return [read(v) for v in closed.jaxpr.outvars]


def _backward_calls(f, *args):
    return [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns
            if e.primitive is pl.pallas_call_p and "(backward," in e.params["name"]]


def _fori(x):
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * v, v)

    return pl.pallas_call(kernel, out_shape=SDS(x.shape, x.dtype), backend="triton")(x)


def _fori_ref(x):
    return lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * x, x)


def _rescaling_loop(x, w):
    """Online-softmax style: the carry is rescaled by a factor computed from the data at
    every step, and the result divided by a carried normaliser."""
    def kernel(x_ref, w_ref, o_ref):
        def body(j, carry):
            m, l, acc = carry
            s = x_ref[...] * w_ref[pl.ds(j * 8, 8), :]
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            a = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new[:, None])
            return m_new, a * l + jnp.sum(p, axis=1), acc * a[:, None] + p * s

        init = (jnp.full((8,), -1e30), jnp.zeros((8,)), jnp.zeros((8, 16)))
        m, l, acc = lax.fori_loop(0, 4, body, init)
        o_ref[...] = acc / l[:, None]

    return pl.pallas_call(kernel, out_shape=SDS((8, 16), jnp.float32),
                          backend="triton")(x, w)


def _rescaling_ref(x, w):
    s = x[None] * w.reshape(4, 8, 16)
    m = jnp.max(jnp.max(s, axis=2), axis=0)
    p = jnp.exp(s - m[None, :, None])
    return jnp.sum(p * s, axis=0) / jnp.sum(jnp.sum(p, axis=2), axis=0)[:, None]


@pytest.mark.parametrize("name", ["fori_loop of length 3", "rescaling carries"])
def test_loops_differentiate_as_triton_kernels_matching_the_reference(name):
    if name == "fori_loop of length 3":
        f, ref, args = _fori, _fori_ref, (_normal(0, 8, 16),)
    else:
        f, ref, args = _rescaling_loop, _rescaling_ref, (_normal(0, 8, 16), _normal(1, 32, 16))
    argnums = tuple(range(len(args)))
    grad = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=argnums)
    with pl.grad_fallback("error"):
        assert len(_backward_calls(grad, *args)) == len(args)
        got = _emulated(grad, *args)
    want = jax.grad(lambda *a: jnp.sum(ref(*a) ** 2), argnums=argnums)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **TOL)


def _scan_then_scan(use_rows):
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        _, ys = lax.scan(lambda c, _: (jnp.sin(c), c * 2.0), v, None, length=3)
        o_ref[...] = use_rows(v, ys)

    return pl.pallas_call(kernel, out_shape=SDS((8, 16), jnp.float32), backend="triton")


def test_a_scan_of_any_length_hands_its_stacked_rows_to_another_scan():
    """Three rows are held as four (Triton tensors have power-of-two shapes); the scan
    that reads them back sees only the three."""
    def reverse_sum(v, ys):
        return lax.scan(lambda c, y: (c * 0.5 + y, None), v, ys, reverse=True)[0]

    x = _normal(0, 8, 16)
    got = pltriton.emulate(_scan_then_scan(reverse_sum), x)
    c, ys = x, []
    for _ in range(3):
        ys.append(c * 2.0)
        c = jnp.sin(c)
    acc = x
    for y in reversed(ys):
        acc = acc * 0.5 + y
    np.testing.assert_allclose(got, acc, **TOL)


def test_padded_stacked_rows_are_refused_anywhere_but_a_scan():
    f = _scan_then_scan(lambda v, ys: jnp.sum(ys, axis=0))
    with pytest.raises(pltriton.TritonLoweringError,
                       match="stacked results of a lax.scan of length 3.*passed to "
                             "'reduce_sum'.*only another lax.scan may read them"):
        pltriton.lower(f, _normal(0, 8, 16))
