"""``jax.vmap`` of ``pallas_call``: one call whose grid gains an outermost batch axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
from pallas._src.primitives.grid import program_id_p

SDS = jax.ShapeDtypeStruct


def _pallas_eqns(closed):
    return [e for e in closed.jaxpr.eqns if e.primitive is pl.pallas_call_p]


def _add_pid(x, y):
    """x + y * program_id(0), blocks of 4 rows; y is (8, 8)."""

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...] * pl.program_id(0).astype(jnp.float32)

    spec = pl.BlockSpec((4, 8), lambda i: (i, 0))
    return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec, spec],
                          out_specs=spec, interpret=True)(x, y)


def _add_pid_ref(x, y):
    return x + y * jnp.repeat(jnp.arange(2.0), 4)[:, None]


@pytest.fixture
def xs(rng):
    return jnp.asarray(rng.normal(size=(3, 8, 8)), jnp.float32)


def test_vmap_batches_into_one_call_with_a_leading_grid_axis(xs):
    y = jnp.ones((8, 8), jnp.float32)
    out = jax.vmap(_add_pid, (0, None))(xs, y)
    np.testing.assert_allclose(out, jax.vmap(_add_pid_ref, (0, None))(xs, y))
    (eqn,) = _pallas_eqns(jax.make_jaxpr(jax.vmap(_add_pid, (0, None)))(xs, y))
    gm = eqn.params["grid_mapping"]
    assert gm.grid == (3, 2)
    x_bm, y_bm, o_bm = gm.block_mappings
    assert isinstance(x_bm.block_dims[0], pl.Squeezed) and x_bm.array_aval.shape == (3, 8, 8)
    # the unbatched operand is not copied per batch element
    assert y_bm.array_aval.shape == (8, 8) and y_bm.block_shape == (4, 8)
    assert o_bm.array_aval.shape == (3, 8, 8)
    # program_id(0) of the kernel now reads grid axis 1
    axes = [e.params["axis"] for e in eqn.params["jaxpr"].jaxpr.eqns
            if e.primitive is program_id_p]
    assert axes == [1]


def test_vmap_in_axes_and_out_axes_other_than_zero(xs):
    y = jnp.ones((8, 8), jnp.float32)
    xt = jnp.transpose(xs, (1, 0, 2))  # batch on axis 1
    out = jax.vmap(_add_pid, (1, None), out_axes=2)(xt, y)
    ref = jax.vmap(_add_pid_ref, (1, None), out_axes=2)(xt, y)
    np.testing.assert_allclose(out, ref)
    out = jax.vmap(_add_pid, (None, 2))(xs[0], jnp.transpose(xs, (1, 2, 0)))
    np.testing.assert_allclose(out, jax.vmap(_add_pid_ref, (None, 2))(
        xs[0], jnp.transpose(xs, (1, 2, 0))))


def test_nested_vmap(rng):
    x = jnp.asarray(rng.normal(size=(2, 3, 8, 8)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(3, 8, 8)), jnp.float32)
    f = jax.vmap(jax.vmap(_add_pid), (0, None))
    np.testing.assert_allclose(f(x, y), jax.vmap(jax.vmap(_add_pid_ref), (0, None))(x, y),
                               rtol=1e-6)
    (eqn,) = _pallas_eqns(jax.make_jaxpr(f)(x, y))
    assert eqn.params["grid_mapping"].grid == (2, 3, 2)


def test_num_programs_is_unchanged_under_vmap(xs):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * jnp.float32(pl.num_programs(0)) + (
            pl.program_id(1).astype(jnp.float32))

    def f(x):
        return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2, 4),
                              in_specs=[pl.BlockSpec((4, 2), lambda i, j: (i, j))],
                              out_specs=pl.BlockSpec((4, 2), lambda i, j: (i, j)),
                              interpret=True)(x)

    def ref(x):
        return x * 2 + jnp.repeat(jnp.arange(4.0), 2)[None, :]

    np.testing.assert_allclose(jax.vmap(f)(xs), jax.vmap(ref)(xs), rtol=1e-6)


def test_program_id_inside_control_flow_is_shifted(xs):
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)

        def body(k, acc):
            return acc + jax.lax.cond(pl.program_id(0) == 1, lambda: 10.0, lambda: 1.0)

        total = jax.lax.fori_loop(0, i + 1, body, 0.0)
        o_ref[...] = x_ref[...] + total

    def f(x):
        spec = pl.BlockSpec((4, 8), lambda i: (i, 0))
        return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                              out_specs=spec, interpret=True)(x)

    def ref(x):
        return x + jnp.repeat(jnp.array([1.0, 20.0]), 4)[:, None]

    np.testing.assert_allclose(jax.vmap(f)(xs), jax.vmap(ref)(xs))


def test_vmap_with_no_block_spec_operands(xs):
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...] @ w_ref[...]

    def f(x, w):
        return pl.pallas_call(kernel, SDS((8, 8), jnp.float32), interpret=True)(x, w)

    w = jnp.asarray(np.eye(8) * 2, jnp.float32)
    np.testing.assert_allclose(jax.vmap(f, (0, None))(xs, w), xs @ w, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(f, (None, 0))(w, xs), w @ xs, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(f)(xs, xs), xs @ xs, rtol=1e-5)


def test_vmap_with_scratch_and_accumulation(rng):
    """A K-loop matmul accumulating in scratch; batch elements must not share scratch."""
    x = jnp.asarray(rng.normal(size=(3, 8, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)

    def kernel(x_ref, w_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...] @ w_ref[...]

        @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    def f(x, w):
        return pl.pallas_call(
            kernel, SDS((8, 8), jnp.float32), grid=(2, 4),
            in_specs=[pl.BlockSpec((4, 4), lambda i, k: (i, k)),
                      pl.BlockSpec((4, 8), lambda i, k: (k, 0))],
            out_specs=pl.BlockSpec((4, 8), lambda i, k: (i, 0)),
            scratch_shapes=[pl.ANY((4, 8), jnp.float32)], interpret=True)(x, w)

    np.testing.assert_allclose(jax.vmap(f, (0, None))(x, w), x @ w, rtol=1e-5, atol=1e-5)


def test_vmap_with_input_output_aliases(xs):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = o_ref[...] + y_ref[...]

    def f(x, y):
        spec = pl.BlockSpec((4, 8), lambda i: (i, 0))
        return pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec, spec],
                              out_specs=spec, input_output_aliases={0: 0},
                              interpret=True)(x, y)

    y = jnp.ones((8, 8), jnp.float32)
    np.testing.assert_allclose(jax.vmap(f, (0, None))(xs, y), xs + 1)
    # the aliased input unbatched, the other batched: the aliased one is broadcast
    np.testing.assert_allclose(jax.vmap(f, (None, 0))(y, xs), xs + 1)


def test_vmap_with_multiple_outputs_and_pytrees(xs):
    def kernel(x_ref, o1_ref, o2_ref):
        o1_ref[...] = x_ref[...] * 2
        o2_ref[...] = jnp.sum(x_ref[...], axis=1, keepdims=True)

    def f(x):
        return pl.pallas_call(
            kernel, (SDS((8, 8), jnp.float32), SDS((8, 1), jnp.float32)), grid=(2,),
            in_specs=[pl.BlockSpec((4, 8), lambda i: (i, 0))],
            out_specs=(pl.BlockSpec((4, 8), lambda i: (i, 0)),
                       pl.BlockSpec((4, 1), lambda i: (i, 0))),
            interpret=True)(x)

    a, b = jax.vmap(f)(xs)
    np.testing.assert_allclose(a, xs * 2)
    np.testing.assert_allclose(b, xs.sum(-1, keepdims=True), rtol=1e-5)


def _gather_rows(idx, x):
    """out[i] = x[idx[i]] with a scalar-prefetch index array."""

    def kernel(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    gs = pl.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(idx.shape[0],),
        in_specs=[pl.BlockSpec((None, 8), lambda i, idx_ref: (idx_ref[i], 0))],
        out_specs=pl.BlockSpec((None, 8), lambda i, idx_ref: (i, 0)))
    return pl.pallas_call(kernel, SDS((idx.shape[0], 8), jnp.float32), grid_spec=gs,
                          interpret=True)(idx, x)


def test_vmap_with_unbatched_scalar_prefetch(xs):
    idx = jnp.array([3, 0, 7, 7], jnp.int32)
    out = jax.vmap(_gather_rows, (None, 0))(idx, xs)
    np.testing.assert_allclose(out, xs[:, idx])
    assert len(_pallas_eqns(jax.make_jaxpr(jax.vmap(_gather_rows, (None, 0)))(idx, xs))) == 1


def test_vmap_with_batched_scalar_prefetch_loops(xs):
    idx = jnp.array([[3, 0, 7, 7], [1, 2, 3, 4], [0, 0, 0, 0]], jnp.int32)
    out = jax.vmap(_gather_rows)(idx, xs)
    np.testing.assert_allclose(out, jax.vmap(lambda i, x: x[i])(idx, xs))
    out = jax.vmap(_gather_rows, (0, None))(idx, xs[0])
    np.testing.assert_allclose(out, xs[0][idx])


def test_vmap_with_interpreter_checks_on(xs):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    spec = pl.BlockSpec((4, 8), lambda i: (i, 0))
    f = pl.pallas_call(kernel, SDS((8, 8), jnp.float32), grid=(2,), in_specs=[spec],
                       out_specs=spec, interpret=pl.InterpretParams(bounds_checks=True))
    np.testing.assert_allclose(jax.vmap(f)(xs), xs + 1)


def test_vmap_of_a_call_with_named_grid_axes():
    from pallas._src.pallas_call import pallas_call_with_axes

    x = jnp.arange(2 * 4 * 8, dtype=jnp.float32).reshape(2, 4, 8)

    def f(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + jax.lax.axis_index("rows").astype(jnp.float32)

        spec = pl.BlockSpec((None, 8), lambda i: (i, 0))
        return pallas_call_with_axes(kernel, SDS((4, 8), jnp.float32), grid=(4,),
                                     in_specs=[spec], out_specs=spec, interpret=True,
                                     grid_names=("rows",))(x)

    out = jax.vmap(f)(x)
    np.testing.assert_allclose(out, x + jnp.arange(4.0)[None, :, None])


def test_jit_of_vmap_matches(xs):
    y = jnp.ones((8, 8), jnp.float32)
    out = jax.jit(jax.vmap(_add_pid, (0, None)))(xs, y)
    np.testing.assert_allclose(out, jax.vmap(_add_pid_ref, (0, None))(xs, y))


def test_vmap_jvp_and_grad_of_pl_kernel_on_a_mesh():
    from pallas._src.mesh import CoreMesh

    mesh = CoreMesh(core=4)

    @pl.kernel(out_type=SDS((16,), jnp.float32), mesh=mesh, interpret=True)
    def f(x_ref, o_ref):
        c = jax.lax.axis_index("core")
        o_ref[pl.ds(c * 4, 4)] = jnp.sin(x_ref[pl.ds(c * 4, 4)]) + c.astype(jnp.float32)

    def ref(x):
        return jnp.sin(x) + jnp.repeat(jnp.arange(4.0), 4)

    xs = jnp.arange(32, dtype=jnp.float32).reshape(2, 16) / 10
    np.testing.assert_allclose(jax.vmap(f)(xs), jax.vmap(ref)(xs), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda x: jax.jvp(f, (x,), (x,))[1])(xs[0]),
                               jax.jvp(ref, (xs[0],), (xs[0],))[1], rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: f(x).sum()))(xs[0]), jnp.cos(xs[0]),
                               rtol=1e-6)
