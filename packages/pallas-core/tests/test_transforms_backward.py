"""Reverse mode on a compiled backend: which kernels the backward pass becomes (masked
loads and stores, loops that read refs, grid order), and when it falls back to XLA."""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct
TOL = dict(rtol=2e-5, atol=2e-5)


def _normal(rng, *shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)

def _named_masked(name):
    """A kernel with a masked load (masked-out lanes read as 0)."""
    def kernel(x_ref, y_ref, o_ref):
        col = jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
        x = pl.load(x_ref, (slice(None), slice(None)), mask=col < 5, other=0.0)
        o_ref[...] = jnp.sin(x) * y_ref[...] + x

    def f(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              name=name, backend="transforms_test")(x, y)

    return f


def _masked_ref(x, y):
    x = jnp.where(jnp.arange(x.shape[1]) < 5, x, 0.0)
    return jnp.sin(x) * y + x


def _named_rescaled(name):
    """A kernel whose output block is rescaled at every step of the grid
    (``o = o / 2 + sin(x_i)``) and revisited along the *outer* grid axis, so its visits
    are not consecutive: the backward kernels (which carry an output block's cotangent
    from one visit to the next) cannot express it, and the backward pass falls back to
    XLA."""
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] = o_ref[...] * 0.5 + jnp.sin(x_ref[...])

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 16), x.dtype),
                              grid=(2, 2),
                              in_specs=[pl.BlockSpec((8, 8), lambda i, j: (i, j))],
                              out_specs=pl.BlockSpec((8, 8), lambda i, j: (0, j)),
                              name=name, backend="transforms_test")(x)

    return f


def _rescaled_ref(x):
    return 0.5 * jnp.sin(x[:8]) + jnp.sin(x[8:])


def _backward_calls(backend):
    return [c for c in backend.calls if "(backward," in c["name"]]


def test_masked_loads_differentiate_as_kernels(rng, compiled_backend):
    """A masked pl.load transposes to a masked accumulation into the cotangent block:
    masked-out lanes get a zero gradient, and the backward pass stays kernels."""
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    f = _named_masked("masked_kernels")
    with pl.grad_fallback("error"):
        got = jax.jit(jax.grad(lambda x, y: (f(x, y) ** 2).sum(), argnums=(0, 1)))(x, y)
    want = jax.grad(lambda x, y: (_masked_ref(x, y) ** 2).sum(), argnums=(0, 1))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **TOL)
    assert len(_backward_calls(compiled_backend)) == 2


def test_masked_stores_differentiate_as_kernels(rng, compiled_backend):
    """A masked pl.store: the stored value's cotangent is the output cotangent where the
    mask holds; positions the store skipped keep the cotangent of what was there."""
    def kernel(x_ref, o_ref):
        col = jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
        o_ref[...] = x_ref[...] * 3.0
        pl.store(o_ref, (slice(None), slice(None)), jnp.tanh(x_ref[...]), mask=col < 3)

    def f(x):
        return pl.pallas_call(kernel, out_shape=SDS(x.shape, x.dtype),
                              backend="transforms_test")(x)

    def ref(x):
        return jnp.where(jnp.arange(8) < 3, jnp.tanh(x), x * 3.0)

    x = _normal(rng, 8, 8)
    with pl.grad_fallback("error"):
        got = jax.jit(jax.grad(lambda x: (f(x) ** 2).sum()))(x)
    np.testing.assert_allclose(got, jax.grad(lambda x: (ref(x) ** 2).sum())(x), **TOL)
    assert len(_backward_calls(compiled_backend)) == 1


def test_loops_that_read_refs_differentiate_as_kernels(rng, compiled_backend):
    """A fori_loop whose body loads blocks of a ref (a flash-attention-style key loop)
    transposes to a reversed loop accumulating into that ref's cotangent; the backward
    kernel of the other input drops that accumulation."""
    def kernel(x_ref, k_ref, o_ref):
        xv = x_ref[...]

        def body(j, acc):
            kb = k_ref[pl.ds(j * 8, 8), :]
            return acc * 0.9 + jnp.sin(xv * kb)

        o_ref[...] = jax.lax.fori_loop(0, 4, body, jnp.zeros_like(xv))

    def f(x, k):
        return pl.pallas_call(kernel, out_shape=SDS(x.shape, x.dtype),
                              backend="transforms_test")(x, k)

    def ref(x, k):
        acc = jnp.zeros_like(x)
        for j in range(4):
            acc = acc * 0.9 + jnp.sin(x * k[8 * j: 8 * j + 8])
        return acc

    x, k = _normal(rng, 8, 16), _normal(rng, 32, 16)
    with pl.grad_fallback("error"):
        got = jax.jit(jax.grad(lambda x, k: (f(x, k) ** 2).sum(), argnums=(0, 1)))(x, k)
    want = jax.grad(lambda x, k: (ref(x, k) ** 2).sum(), argnums=(0, 1))(x, k)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert len(_backward_calls(compiled_backend)) == 2


def test_compiled_backend_grad_falls_back_to_xla_and_warns_once(rng, compiled_backend):
    """A backward pass that cannot be emitted as kernels runs as XLA ops (the
    interpreter's expansion, differentiated by JAX), with one warning per kernel that
    says why."""
    x = _normal(rng, 16, 16)
    f = _named_rescaled("fallback_warns")
    want = jax.grad(lambda x: _rescaled_ref(x).sum())(x)
    with pytest.warns(pl.GradFallbackWarning,
                      match="'fallback_warns' cannot be emitted as kernels.*revisited.*XLA"):
        np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), want, **TOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: no warning
        np.testing.assert_allclose(jax.grad(lambda x: 2 * f(x).sum())(x), 2 * want, **TOL)


def test_grad_fallback_can_be_refused_or_silenced(rng, compiled_backend):
    x = _normal(rng, 16, 16)
    with pl.grad_fallback("error"):
        with pytest.raises(NotImplementedError,
                           match="grad_fallback is 'error'.*custom_vjp.*interpret=True"):
            jax.grad(lambda x: _named_rescaled("refused")(x).sum())(x)
    with pl.grad_fallback("allow"), warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.grad(lambda x: _named_rescaled("silenced")(x).sum())(x)
    with pytest.raises(ValueError, match="one of"):
        pl.grad_fallback("sometimes")


# ------------------------------------------------------------------------------------
# Backward kernels: which grid order they run in, and what they refuse.


def _tiled_matmul(x, w, *, rescale=None, backend="transforms_test"):
    """x @ w over a (i, j, k) grid, accumulating into the output block along k; with
    ``rescale``, the accumulator is scaled at every step (``o = o * rescale + x @ w``)."""
    def kernel(x_ref, w_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        prod = jnp.dot(x_ref[...], w_ref[...], precision=jax.lax.Precision.HIGHEST)
        if rescale is None:
            o_ref[...] += prod
        else:
            o_ref[...] = o_ref[...] * rescale + prod

    (m, k), n = x.shape, w.shape[1]
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // 8, n // 8, k // 8),
        in_specs=[pl.BlockSpec((8, 8), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((8, 8), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((8, 8), lambda i, j, kk: (i, j)),
        backend=backend, name=f"tiled_matmul_{rescale}")(x, w)


def test_backward_kernels_accumulate_with_their_reduction_axes_innermost(
        rng, compiled_backend):
    """d/dx of a k-accumulating matmul sums over j, d/dw over i: each backward call
    runs the grid with the axes its cotangent's index map does not use last, so every
    program adding into one cotangent block runs consecutively."""
    x, w = _normal(rng, 16, 24), _normal(rng, 24, 32)  # grid (i, j, k) = (2, 4, 3)
    loss = lambda f: lambda x, w: (f(x, w) ** 2).sum()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = jax.grad(loss(_tiled_matmul), argnums=(0, 1))(x, w)
    want = jax.grad(loss(lambda a, b: jnp.dot(a, b, precision="highest")), argnums=(0, 1))(
        x, w)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-4)
    grids = {c["name"].split("backward, ")[1].rstrip(")"): c["grid"]
             for c in compiled_backend.calls if "(backward," in c["name"]}
    assert grids == {"tangent of args[0]": (2, 3, 4),  # (i, k) outer, j inner
                     "tangent of args[1]": (4, 3, 2)}  # (j, k) outer, i inner


def test_a_rescaled_accumulator_becomes_a_reverse_sweep(rng, compiled_backend):
    """The cotangent reaching an output block rescaled at every k step (``o = o * 0.5 +
    x @ w``) differs per step: a state sweep runs the grid backwards carrying it, and
    the cotangent of x accumulates from the per-step cotangents the sweep saved."""
    x, w = _normal(rng, 16, 24), _normal(rng, 24, 16)

    def ref(a, b):
        o = jnp.zeros((16, 16))
        for kk in range(3):
            o = o * 0.5 + jnp.dot(a[:, 8 * kk:8 * kk + 8], b[8 * kk:8 * kk + 8],
                                  precision="highest")
        return o

    with pl.grad_fallback("error"):
        got = jax.grad(lambda a: (_tiled_matmul(a, w, rescale=0.5) ** 2).sum())(x)
    np.testing.assert_allclose(got, jax.grad(lambda a: (ref(a, w) ** 2).sum())(x),
                               rtol=1e-4, atol=1e-4)
    grids = {c["name"].split("backward, ")[1].rstrip(")"): c["grid"]
             for c in compiled_backend.calls if "(backward," in c["name"]}
    assert grids == {"carried state": (2, 2, 3), "tangent of args[0]": (2, 3, 2)}
    assert not [c for c in compiled_backend.calls if "(forward, saving" in c["name"]]


def _online_softmax_sum(x, v, *, backend="transforms_test"):
    """Per row block, ``softmax(x) @ v`` over column blocks on a grid axis, the
    online-softmax state (m, l, acc) in scratch: reset at the first step, normalised
    into the output at the last."""
    def kernel(x_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        j = pl.program_id(1)

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full_like(m_ref, -1e30)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

        s = x_ref[...]
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - jnp.max(m_new, axis=1, keepdims=True))
        a = jnp.exp(m_prev - m_new)
        l_ref[...] = a * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        acc_ref[...] = a * acc_ref[...] + jnp.dot(p, v_ref[...], precision="highest")
        m_ref[...] = m_new

        @pl.when(j == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = acc_ref[...] / l_ref[...]

    return pl.pallas_call(
        kernel, out_shape=SDS((8, 8), x.dtype), grid=(1, 2),
        in_specs=[pl.BlockSpec((8, 8), lambda i, j: (i, j)),
                  pl.BlockSpec((8, 8), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((8, 8), lambda i, j: (i, 0)),
        scratch_shapes=[pl.ANY((8, 8), jnp.float32)] * 3, backend=backend)(x, v)


def test_scratch_carried_along_the_grid_is_saved_and_swept_back(rng, compiled_backend):
    """Online-softmax state in scratch carried along a grid axis: a forward call saves
    the state entering each step, the state sweep carries its cotangent backwards, and
    each input's cotangent comes from its own kernel; the numbers are the reference's."""
    x, v = _normal(rng, 8, 16), _normal(rng, 16, 8)

    def loss(f):
        return lambda a, b: (f(a, b) ** 2).sum()

    def ref(a, b):
        return jax.nn.softmax(a, axis=1) @ b

    with pl.grad_fallback("error"):
        got = jax.grad(loss(_online_softmax_sum), argnums=(0, 1))(x, v)
    want = jax.grad(loss(ref), argnums=(0, 1))(x, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    names = sorted(c["name"].split("(")[-1].rstrip(")") for c in compiled_backend.calls
                   if "(" in c["name"])
    assert names == ["backward, carried state", "backward, tangent of args[0]",
                     "backward, tangent of args[1]", "forward, saving state"]


def test_dimension_semantics_follow_the_reordered_grid():
    from pallas._src.transforms.backward_common import permuted_params

    @__import__("dataclasses").dataclass(frozen=True)
    class Params:
        dimension_semantics: tuple = ("parallel", "parallel", "arbitrary")

    # cotangent of w: axes (k, j) outer, i inner (made "arbitrary": it accumulates)
    assert permuted_params(Params(), [2, 1, 0], [0]).dimension_semantics == (
        "arbitrary", "parallel", "arbitrary")
    assert permuted_params(None, [1, 0], [0]) is None


@pytest.mark.skipif(not os.environ.get("PALLAS_SLOW_TESTS"),
                    reason="slow (~1 min, out of CI): PALLAS_SLOW_TESTS=1 runs it")
def test_second_order_through_carried_state_stays_kernels(rng, compiled_backend):
    """grad of grad through a rescaled accumulator: the state sweep (whose index maps
    run the grid backwards) is itself a kernel carrying state, transposed the same way."""
    x, w = _normal(rng, 16, 24), _normal(rng, 24, 16)

    def ref(a, b):
        o = jnp.zeros((16, 16))
        for kk in range(3):
            o = o * 0.5 + jnp.dot(a[:, 8 * kk:8 * kk + 8], b[8 * kk:8 * kk + 8],
                                  precision="highest")
        return o

    def second(f):
        g = jax.grad(lambda a, b: jnp.sum(jnp.sin(f(a, b)) ** 2), argnums=(0, 1))
        return jax.grad(lambda a, b: sum(jnp.sum(t ** 2) for t in g(a, b)),
                        argnums=(0, 1))(x, w)

    with pl.grad_fallback("error"):
        got = second(lambda a, b: _tiled_matmul(a, b, rescale=0.5))
    for g, v in zip(got, second(ref)):
        np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-4)
    assert any("(backward, carried state) (backward, carried state)" in c["name"]
               for c in compiled_backend.calls)
