"""``jax.jvp``, ``jax.grad``/``jax.vjp`` and ``custom_vjp`` through ``pallas_call``."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import pallas as pl
import pallas.plugins

SDS = jax.ShapeDtypeStruct
TOL = dict(rtol=2e-5, atol=2e-5)


def _pallas_eqns(closed):
    return [e for e in closed.jaxpr.eqns if e.primitive is pl.pallas_call_p]


def _assert_jvp_matches(f, ref, args, tangents):
    # (under jit: eager transformations would dispatch the interpreter op by op)
    p1, t1 = jax.jit(lambda a, t: jax.jvp(f, a, t))(args, tangents)
    p2, t2 = jax.jvp(ref, args, tangents)
    for a, b in zip(jax.tree_util.tree_leaves((p1, t1)), jax.tree_util.tree_leaves((p2, t2))):
        np.testing.assert_allclose(a, b, **TOL)


def _normal(rng, *shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


# --------------------------------------------------------------------------------------
# Kernels and their plain-JAX references.


def elementwise(x, y, **kw):
    def kernel(x_ref, y_ref, o_ref):
        x, y = x_ref[...], y_ref[...]
        o_ref[...] = jnp.sin(x) * jnp.exp(y) + jnp.tanh(x / (1.0 + y * y))

    spec = pl.BlockSpec((4, 8), lambda i: (i, 0))
    return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec, spec],
                          out_specs=spec, interpret=kw.pop("interpret", True), **kw)(x, y)


def elementwise_ref(x, y):
    return jnp.sin(x) * jnp.exp(y) + jnp.tanh(x / (1.0 + y * y))


def matmul(x, w, **kw):
    """A tiled matmul accumulating over K in a scratch buffer."""

    def kernel(x_ref, w_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...])

        @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = jnp.tanh(acc_ref[...])

    return pl.pallas_call(
        kernel, SDS((x.shape[0], w.shape[1]), jnp.float32), grid=(2, 2),
        in_specs=[pl.BlockSpec((4, 8), lambda i, k: (i, k)),
                  pl.BlockSpec((8, 8), lambda i, k: (k, 0))],
        out_specs=pl.BlockSpec((4, 8), lambda i, k: (i, 0)),
        scratch_shapes=[pl.ANY((4, 8), jnp.float32)], interpret=True, **kw)(x, w)


def matmul_ref(x, w):
    return jnp.tanh(x @ w)


def softmax(x):
    def kernel(x_ref, o_ref):
        x = x_ref[...]
        e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
        o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)

    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(x.shape[0] // 2,),
                          in_specs=[spec], out_specs=spec, interpret=True)(x)


def control_flow(x):
    def kernel(x_ref, o_ref):
        x = x_ref[...]
        y = jax.lax.fori_loop(0, 3, lambda k, acc: acc * jnp.cos(acc) + x, x)
        o_ref[...] = jax.lax.cond(pl.program_id(0) == 0, lambda: y * y, lambda: jnp.sin(y))

    spec = pl.BlockSpec((4, 8), lambda i: (i, 0))
    return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                          out_specs=spec, interpret=True)(x)


def control_flow_ref(x):
    y = jax.lax.fori_loop(0, 3, lambda k, acc: acc * jnp.cos(acc) + x, x)
    return jnp.concatenate([y[:4] * y[:4], jnp.sin(y[4:])])


# --------------------------------------------------------------------------------------
# JVP: one pallas_call over primals and tangents.


def test_jvp_elementwise_is_one_call(rng):
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    _assert_jvp_matches(elementwise, elementwise_ref, (x, y), (_normal(rng, 8, 8),
                                                               _normal(rng, 8, 8)))
    closed = jax.make_jaxpr(lambda x, y: jax.jvp(elementwise, (x, y), (x, y)))(x, y)
    (eqn,) = _pallas_eqns(closed)
    gm = eqn.params["grid_mapping"]
    assert [bm.origin for bm in gm.block_mappings] == [
        "args[0]", "args[1]", "tangent of args[0]", "tangent of args[1]", "outputs",
        "tangent of outputs"]
    assert gm.block_mappings[2].block_shape == gm.block_mappings[0].block_shape


def test_jvp_with_a_symbolic_zero_tangent_has_no_tangent_ref(rng):
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    _assert_jvp_matches(lambda x: elementwise(x, y), lambda x: elementwise_ref(x, y), (x,),
                        (_normal(rng, 8, 8),))
    closed = jax.make_jaxpr(lambda x: jax.jvp(lambda x: elementwise(x, y), (x,), (x,)))(x)
    (eqn,) = _pallas_eqns(closed)
    assert eqn.params["grid_mapping"].num_inputs == 3


def test_jvp_dot_with_scratch_accumulation(rng):
    x, w = _normal(rng, 8, 16), _normal(rng, 16, 8) * 0.3
    _assert_jvp_matches(matmul, matmul_ref, (x, w), (_normal(rng, 8, 16), _normal(rng, 16, 8)))
    closed = jax.make_jaxpr(lambda x, w: jax.jvp(matmul, (x, w), (x, w)))(x, w)
    (eqn,) = _pallas_eqns(closed)
    assert eqn.params["grid_mapping"].num_scratch == 2  # the scratch and its tangent


def test_jvp_reductions(rng):
    x = _normal(rng, 4, 8)
    _assert_jvp_matches(softmax, lambda x: jax.nn.softmax(x, axis=-1), (x,), (_normal(rng, 4, 8),))


def test_jvp_control_flow(rng):
    x = _normal(rng, 8, 8) * 0.5
    _assert_jvp_matches(control_flow, control_flow_ref, (x,), (_normal(rng, 8, 8),))


def test_jvp_while_loop_kernel(rng):
    def kernel(x_ref, o_ref):
        def body(c):
            k, v = c
            return k + 1, jnp.sin(v) + 0.5 * v

        o_ref[...] = jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x_ref[...]))[1]

    def f(x):
        return pl.pallas_call(kernel, SDS(x.shape, x.dtype), interpret=True)(x)

    def ref(x):
        for _ in range(3):
            x = jnp.sin(x) + 0.5 * x
        return x

    x = _normal(rng, 8)
    _assert_jvp_matches(f, ref, (x,), (_normal(rng, 8),))


def test_jvp_run_scoped_and_masked_loads(rng):
    def kernel(x_ref, o_ref):
        def body(tmp_ref):
            tmp_ref[...] = jnp.exp(x_ref[...])
            mask = jnp.arange(8) < 5
            v = pl.load(tmp_ref.at[pl.ds(0, 8)], mask=mask, other=2.0)
            pl.store(o_ref.at[pl.ds(0, 8)], v * x_ref[...], mask=jnp.arange(8) < 8)

        pl.run_scoped(body, pl.ANY((8,), jnp.float32))

    def f(x):
        return pl.pallas_call(kernel, SDS((8,), jnp.float32), interpret=True)(x)

    def ref(x):
        return jnp.where(jnp.arange(8) < 5, jnp.exp(x), 2.0) * x

    x = _normal(rng, 8)
    _assert_jvp_matches(f, ref, (x,), (_normal(rng, 8),))
    check_grads(jax.jit(f), (x,), order=1, modes=["rev"])


def test_integer_inputs_get_no_tangent(rng):
    def kernel(x_ref, n_ref, o_ref, cnt_ref):
        o_ref[...] = x_ref[...] * n_ref[...].astype(jnp.float32)
        cnt_ref[...] = n_ref[...] + 1

    def f(x, n):
        return pl.pallas_call(kernel, (SDS((8,), jnp.float32), SDS((8,), jnp.int32)),
                              interpret=True)(x, n)

    x, n = _normal(rng, 8), jnp.arange(8, dtype=jnp.int32)
    (o, c), (to, tc) = jax.jvp(lambda x: f(x, n), (x,), (jnp.ones(8),))
    np.testing.assert_allclose(to, n.astype(jnp.float32))
    assert tc.dtype == jax.dtypes.float0
    np.testing.assert_array_equal(c, n + 1)
    closed = jax.make_jaxpr(lambda x: jax.jvp(lambda x: f(x, n), (x,), (x,)))(x)
    (eqn,) = _pallas_eqns(closed)
    assert eqn.params["grid_mapping"].num_inputs == 3  # x, n, tangent of x
    assert eqn.params["grid_mapping"].num_outputs == 3  # o, cnt, tangent of o
    g = jax.grad(lambda x: f(x, n)[0].sum())(x)
    np.testing.assert_allclose(g, n.astype(jnp.float32))


def test_jvp_and_grad_with_input_output_aliases(rng):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = o_ref[...] * jnp.sin(y_ref[...])

    def f(x, y):
        spec = pl.BlockSpec((4,), lambda i: (i,))
        return pl.pallas_call(kernel, SDS((8,), jnp.float32), grid=(2,), in_specs=[spec, spec],
                              out_specs=spec, input_output_aliases={0: 0}, interpret=True)(x, y)

    def ref(x, y):
        return x * jnp.sin(y)

    x, y = _normal(rng, 8), _normal(rng, 8)
    _assert_jvp_matches(f, ref, (x, y), (_normal(rng, 8), _normal(rng, 8)))
    check_grads(jax.jit(f), (x, y), order=1, modes=["rev"])


def test_jvp_with_interpreter_checks_on(rng):
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    f = functools.partial(elementwise, interpret=pl.InterpretParams(bounds_checks=True))
    _assert_jvp_matches(f, elementwise_ref, (x, y), (x, y))
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: f(x, y).sum()))(x),
                               jax.grad(lambda x: elementwise_ref(x, y).sum())(x), **TOL)


# --------------------------------------------------------------------------------------
# grad / vjp without a custom_vjp (interpreter).


@pytest.mark.parametrize("name", ["elementwise", "matmul", "softmax", "control_flow"])
def test_check_grads_fwd_and_rev(rng, name):
    cases = {
        "elementwise": (elementwise, (_normal(rng, 8, 8), _normal(rng, 8, 8) * 0.5)),
        "matmul": (matmul, (_normal(rng, 8, 16) * 0.3, _normal(rng, 16, 8) * 0.3)),
        "softmax": (softmax, (_normal(rng, 4, 8),)),
        "control_flow": (control_flow, (_normal(rng, 8, 8) * 0.3,)),
    }
    f, args = cases[name]
    check_grads(jax.jit(f), args, order=1, modes=["fwd", "rev"], atol=2e-2, rtol=2e-2)


def test_grad_matches_reference(rng):
    x, w = _normal(rng, 8, 16) * 0.3, _normal(rng, 16, 8) * 0.3
    loss = lambda f: lambda x, w: jnp.sum(f(x, w) ** 2)  # noqa: E731
    g2 = jax.grad(loss(matmul_ref), (0, 1))(x, w)
    g3 = jax.jit(jax.grad(loss(matmul), (0, 1)))(x, w)
    for a, b in zip(g3, g2):
        np.testing.assert_allclose(a, b, **TOL)


def test_second_order(rng):
    x = _normal(rng, 8, 8) * 0.5
    loss = lambda f: lambda x: jnp.sum(f(x, x))  # noqa: E731
    hvp = lambda f: jax.jit(lambda x, v: jax.jvp(jax.grad(loss(f)), (x,), (v,))[1])  # noqa: E731
    np.testing.assert_allclose(hvp(elementwise)(x, x), hvp(elementwise_ref)(x, x), **TOL)
    gg = lambda f: jax.jit(jax.grad(lambda x: jnp.sum(jax.grad(loss(f))(x))))  # noqa: E731
    np.testing.assert_allclose(gg(elementwise)(x), gg(elementwise_ref)(x), **TOL)


def test_grad_with_scalar_prefetch(rng):
    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...]) * (idx_ref[pl.program_id(0)] + 1).astype(jnp.float32)

    def f(x, idx):
        gs = pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,),
            in_specs=[pl.BlockSpec((None, 8), lambda i, idx_ref: (idx_ref[i], 0))],
            out_specs=pl.BlockSpec((None, 8), lambda i, idx_ref: (i, 0)))
        return pl.pallas_call(kernel, SDS((4, 8), jnp.float32), grid_spec=gs,
                              interpret=True)(idx, x)

    def ref(x, idx):
        return jnp.sin(x[idx]) * (idx + 1).astype(jnp.float32)[:, None]

    x, idx = _normal(rng, 8, 8), jnp.array([3, 0, 7, 3], jnp.int32)
    g1 = jax.jit(jax.grad(lambda x: jnp.sum(f(x, idx) ** 2)))(x)
    g2 = jax.grad(lambda x: jnp.sum(ref(x, idx) ** 2))(x)
    np.testing.assert_allclose(g1, g2, **TOL)


def test_grad_composes_with_vmap_scan_and_checkpoint(rng):
    x = _normal(rng, 3, 8, 8) * 0.5
    y = _normal(rng, 8, 8) * 0.5

    def loss(f):
        def step(c, _):
            return f(c, y) * 0.5, None

        return lambda x: jnp.sum(jax.lax.scan(step, x, None, length=2)[0])

    g_ref = jax.vmap(jax.grad(loss(elementwise_ref)))(x)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(loss(elementwise))))(x), g_ref, **TOL)
    np.testing.assert_allclose(
        jax.jit(jax.vmap(jax.grad(jax.checkpoint(loss(elementwise)))))(x), g_ref, **TOL)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: jnp.sum(jax.lax.cond(
        x[0, 0] > -100, lambda x: elementwise(x, y), jnp.cos, x))))(x[0]),
        jax.grad(lambda x: jnp.sum(elementwise_ref(x, y)))(x[0]), **TOL)


def test_linearize(rng):
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    out, lin = jax.linearize(jax.jit(elementwise), x, y)
    _, t_ref = jax.jvp(elementwise_ref, (x, y), (y, x))
    np.testing.assert_allclose(lin(y, x), t_ref, **TOL)


def test_grad_of_a_data_dependent_while_loop_raises(rng):
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.while_loop(lambda v: jnp.sum(v) < 100.0, lambda v: v * 2.0,
                                        x_ref[...])

    f = pl.pallas_call(kernel, SDS((8,), jnp.float32), interpret=True)
    x = jnp.ones((8,), jnp.float32)
    _, t = jax.jvp(f, (x,), (x,))  # forward mode works
    np.testing.assert_allclose(t, 16.0 * x)
    with pytest.raises(ValueError, match="[Rr]everse-mode differentiation does not work"):
        jax.grad(lambda x: f(x).sum())(x)


# --------------------------------------------------------------------------------------
# custom_vjp around kernels: the usual upstream pattern.


def test_custom_vjp_around_kernels(rng):
    def fwd_kernel(x_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...])

    def bwd_kernel(x_ref, g_ref, o_ref):
        o_ref[...] = jnp.cos(x_ref[...]) * g_ref[...]

    @jax.custom_vjp
    def f(x):
        return pl.pallas_call(fwd_kernel, SDS(x.shape, x.dtype), interpret=True)(x)

    def f_fwd(x):
        return f(x), x

    def f_bwd(x, g):
        return (pl.pallas_call(bwd_kernel, SDS(x.shape, x.dtype), interpret=True)(x, g),)

    f.defvjp(f_fwd, f_bwd)
    x = _normal(rng, 8)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), jnp.cos(x), **TOL)
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: f(x).sum()))(jnp.stack([x, x])),
                               jnp.cos(jnp.stack([x, x])), **TOL)
    check_grads(jax.jit(f), (x,), order=1, modes=["rev"])


# --------------------------------------------------------------------------------------
# A compiled (non-interpret) backend (the compiled_backend fixture is in conftest.py);
# which kernels its backward passes become is in test_transforms_backward.py.


def test_compiled_backend_jvp_and_vmap_work(rng, compiled_backend):
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    f = functools.partial(elementwise, interpret=False, backend="transforms_test")
    _assert_jvp_matches(f, elementwise_ref, (x, y), (y, x))
    np.testing.assert_allclose(jax.vmap(f)(jnp.stack([x, y]), jnp.stack([y, x])),
                               jax.vmap(elementwise_ref)(jnp.stack([x, y]), jnp.stack([y, x])),
                               **TOL)
    assert (2, 2) in [c["grid"] for c in compiled_backend.calls]  # batch axis first


def test_compiled_backend_grad_runs_backward_kernels(rng, compiled_backend):
    """The backward pass of a compiled call is pallas_calls of the same backend: one per
    input that needs a cotangent, each with its own cotangent as its only output."""
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    f = functools.partial(elementwise, interpret=False, backend="transforms_test")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        got = jax.grad(lambda x, y: (f(x, y) ** 2).sum(), argnums=(0, 1))(x, y)
    want = jax.grad(lambda x, y: (elementwise_ref(x, y) ** 2).sum(), argnums=(0, 1))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **TOL)
    backward = [c for c in compiled_backend.calls if "(backward," in c["name"]]
    assert len(backward) == 2


def test_second_order_differentiates_the_backward_kernels(rng, compiled_backend):
    """grad of grad: the backward kernel's program-local scratch (its copy of the
    output cotangent) gets a cotangent buffer zeroed in every program, so the second
    backward pass is kernels too."""
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    f = functools.partial(elementwise, interpret=False, backend="transforms_test")

    def gsum(fn):
        return lambda x: jnp.sum(jax.grad(lambda a: jnp.sum(fn(a, y) ** 2))(x))

    with pl.grad_fallback("error"):
        got = jax.jit(jax.grad(gsum(f)))(x)
    np.testing.assert_allclose(got, jax.grad(gsum(elementwise_ref))(x), rtol=1e-4, atol=1e-4)
    assert len([c for c in compiled_backend.calls if "(backward," in c["name"]]) >= 2


def test_grad_with_the_default_cpu_interpret_backend(rng, clean_registry):
    """On CPU without interpret=True the built-in ``interpret`` backend runs the call,
    so reverse mode works there too."""
    if jax.default_backend() != "cpu":
        pytest.skip("the interpret backend is the default only on CPU")
    x, y = _normal(rng, 8, 8), _normal(rng, 8, 8)
    f = functools.partial(elementwise, interpret=False)
    g = jax.jit(jax.grad(lambda x: f(x, y).sum()))(x)
    np.testing.assert_allclose(g, jax.grad(lambda x: elementwise_ref(x, y).sum())(x), **TOL)


@pytest.mark.parametrize("policy", [None, "everything_saveable", "nothing_saveable"])
def test_grad_through_checkpoint_policies(rng, policy):
    pol = policy and getattr(jax.checkpoint_policies, policy)
    x, y = _normal(rng, 8, 8) * 0.5, _normal(rng, 8, 8) * 0.5

    def loss(f):
        # the second call is not differentiated: it stays a plain (known) call
        return lambda x: jnp.sum(jax.checkpoint(
            lambda x: jnp.sin(f(x, y)) * f(jax.lax.stop_gradient(x), y), policy=pol)(x))

    np.testing.assert_allclose(jax.jit(jax.grad(loss(elementwise)))(x),
                               jax.grad(loss(elementwise_ref))(x), **TOL)


def test_kernels_with_debug_prints_differentiate(rng, capsys):
    def kernel(x_ref, o_ref):
        pl.debug_print("x0={}", x_ref[0])
        pl.debug_check(x_ref[0] < 1e6, "too large")
        o_ref[...] = jnp.sin(x_ref[...])

    f = pl.pallas_call(kernel, SDS((8,), jnp.float32), interpret=True)
    x = _normal(rng, 8)
    _assert_jvp_matches(f, jnp.sin, (x,), (x,))
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: f(x).sum()))(x), jnp.cos(x), **TOL)
    jax.effects_barrier()
    assert "x0=" in capsys.readouterr().out
