"""pallas.fuser block-spec rules, one primitive family at a time: the pulled/pushed specs
and the kernel function's values, checked against plain JAX on the same blocks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
from pallas import fuser

SDS = jax.ShapeDtypeStruct
F32 = jnp.float32


def pull(f, spec, *args, grid_len=2):
    fn, values, prefetch = fuser.get_fusion_values(f, *args)
    kernel_fn, (value_specs, *in_specs), _ = fuser.pull_block_spec(
        fn, spec, grid_len=grid_len,
        scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(values, *args)
    return kernel_fn, value_specs, in_specs, values, prefetch


def block(x, spec, *grid):
    """The block of ``x`` that ``spec`` selects at ``grid`` (Blocked/squeezed dims)."""
    idx = spec.index_map(*grid)
    window = []
    for i, d in zip(idx, spec.block_shape):
        window.append(i if d is None else slice(i * d, (i + 1) * d))
    return x[tuple(window)]


def test_elementwise_chain_keeps_the_block_and_computes_on_it(rng):
    x = jnp.asarray(rng.standard_normal((64, 256)), F32)
    spec = pl.BlockSpec((32, 128), lambda i, j: (i, j))
    f = lambda x: jnp.exp(jnp.tanh(x) * 2.0 - 1.0)  # noqa: E731
    kernel_fn, _, (x_spec,), _, _ = pull(f, spec, SDS(x.shape, F32))
    assert x_spec.block_shape == (32, 128) and x_spec.index_map(1, 0) == (1, 0)
    np.testing.assert_allclose(kernel_fn((1, 0), (), (), block(x, x_spec, 1, 0)),
                               block(f(x), spec, 1, 0), rtol=1e-6)


def test_any_transpose_permutation_pulls_and_pushes(rng):
    x = jnp.asarray(rng.standard_normal((8, 16, 32)), F32)
    f = lambda x: jnp.transpose(x, (1, 2, 0))  # (16, 32, 8)  # noqa: E731
    spec = pl.BlockSpec((8, 16, 8), lambda i, j: (i, j, 0))
    kernel_fn, _, (x_spec,), _, _ = pull(f, spec, SDS(x.shape, F32))
    assert x_spec.block_shape == (8, 8, 16)
    assert x_spec.index_map(1, 1) == (0, 1, 1)
    np.testing.assert_array_equal(kernel_fn((1, 1), (), (), block(x, x_spec, 1, 1)),
                                  block(f(x), spec, 1, 1))
    pushed = fuser.push_block_spec(f, pl.BlockSpec((8, 8, 16), lambda i: (0, i, 1)))(
        SDS(x.shape, F32))
    assert pushed.block_shape == (8, 16, 8) and pushed.index_map(1) == (1, 1, 0)


def test_reshape_split_pulls_whole_minor_dims(rng):
    x = jnp.asarray(rng.standard_normal((16, 512)), F32)
    f = lambda x: x.reshape(16, 4, 128)  # noqa: E731
    spec = pl.BlockSpec((8, 2, 128), lambda i, j: (i, j, 0))
    kernel_fn, _, (x_spec,), _, _ = pull(f, spec, SDS(x.shape, F32))
    assert x_spec.block_shape == (8, 256) and x_spec.index_map(1, 1) == (1, 1)
    np.testing.assert_array_equal(kernel_fn((1, 1), (), (), block(x, x_spec, 1, 1)),
                                  block(f(x), spec, 1, 1))
    bad = pl.BlockSpec((8, 4, 64), lambda i, j: (i, 0, j))
    with pytest.raises(NotImplementedError, match="reshape.*cover result dim 2 whole"):
        pull(f, bad, SDS(x.shape, F32))


def test_broadcast_bias_reads_a_size_one_block(rng):
    b = jnp.asarray(rng.standard_normal((256,)), F32)
    x = jnp.asarray(rng.standard_normal((64, 256)), F32)
    f = lambda x, b: x + b[None, :]  # noqa: E731
    spec = pl.BlockSpec((32, 128), lambda i, j: (i, j))
    kernel_fn, _, (x_spec, b_spec), _, _ = pull(f, spec, SDS(x.shape, F32), SDS(b.shape, F32))
    assert b_spec.block_shape == (128,) and b_spec.index_map(1, 1) == (1,)
    out = kernel_fn((1, 1), (), (), block(x, x_spec, 1, 1), b[128:])
    np.testing.assert_allclose(out, block(f(x, b), spec, 1, 1), rtol=1e-6)


def test_reductions_pull_the_reduced_axis_whole(rng):
    x = jnp.asarray(rng.standard_normal((64, 96)), F32)
    spec = pl.BlockSpec((16,), lambda i: (i,))
    for reduce in (jnp.max, jnp.min, jnp.sum):
        f = lambda x, reduce=reduce: reduce(x, axis=1)  # noqa: E731
        kernel_fn, _, (x_spec,), _, _ = pull(f, spec, SDS(x.shape, F32), grid_len=1)
        assert tuple(getattr(d, "block_size", d) for d in x_spec.block_shape) == (16, 96)
        np.testing.assert_allclose(kernel_fn((2,), (), (), x[32:48]), f(x)[32:48], rtol=1e-5)


def test_dynamic_slice_start_is_scalar_prefetch(rng):
    x = jnp.asarray(rng.standard_normal((4, 64, 128)), F32)
    start = jnp.array(2, jnp.int32)
    f = lambda: lax.dynamic_slice(x, (start, 0, 0), (1, 64, 128))[0]  # noqa: E731
    fn, values, prefetch = fuser.get_fusion_values(f)
    assert len(values) == 1 and len(prefetch) == 1
    spec = pl.BlockSpec((32, 128), lambda i, *_: (i, 0))
    kernel_fn, (value_specs,), _ = fuser.pull_block_spec(
        fn, spec, grid_len=1,
        scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(values)
    prefetch = tuple(p[None] for p in prefetch)  # scalar prefetch operands are 1-element
    assert value_specs[0].block_shape == (None, 32, 128)
    assert value_specs[0].index_map(1, *prefetch) == (2, 1, 0)
    np.testing.assert_array_equal(kernel_fn((1,), prefetch, (x[2, 32:64],)), x[2, 32:64])


def test_iota_is_computed_per_block():
    f = lambda: lax.broadcasted_iota(jnp.int32, (4, 64, 128), 1)  # noqa: E731
    spec = pl.BlockSpec((None, 16, 128), lambda i, j: (i, j, 0))
    kernel_fn, _, _, _, _ = pull(f, spec)
    np.testing.assert_array_equal(kernel_fn((3, 2), (), ()), f()[3, 32:48])


def test_a_value_used_with_two_different_blocks_is_a_dag_error():
    f = lambda x: x[0] + x[1]  # noqa: E731
    with pytest.raises(ValueError, match="cannot uniquely pull block specs"):
        pull(f, pl.BlockSpec((8, 128), lambda i, j: (i, j)), SDS((2, 16, 128), F32))


def test_unsupported_primitive_error_names_primitive_and_block_spec():
    f = lambda x: jnp.sort(x, axis=0)  # noqa: E731
    with pytest.raises(NotImplementedError,
                       match=r"`sort`.*block_shape=\(8, 128\).*register_pull_block_spec_rule"):
        pull(f, pl.BlockSpec((8, 128), lambda i: (i, 0)), SDS((16, 128), F32), grid_len=1)
    with pytest.raises(NotImplementedError, match=r"push a block spec through `sort`"):
        fuser.push_block_spec(f, pl.BlockSpec((8, 128), lambda i: (i, 0)))(SDS((16, 128), F32))


def test_rules_are_keyed_by_primitive_objects_not_names():
    with pytest.raises(TypeError, match="primitive objects"):
        fuser.register_pull_block_spec_rule("exp")


def test_a_custom_primitive_gets_rules_through_the_registry():
    double_p = jax.extend.core.Primitive("double_for_fuser_test")
    double_p.def_impl(lambda x: x * 2)
    double_p.def_abstract_eval(lambda x: x)
    fuser.register_pull_block_spec_rule(double_p)(lambda ctx, t: [t])
    fuser.register_eval_rule(double_p)(lambda ctx, x: double_p.bind(x))
    fuser.register_push_block_spec_rule(double_p)(lambda ctx, s: s)
    try:
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        kernel_fn, _, (x_spec,), _, _ = pull(double_p.bind, spec, SDS((16, 128), F32),
                                             grid_len=1)
        assert x_spec.index_map(1) == (1, 0)
        np.testing.assert_array_equal(kernel_fn((1,), (), (), jnp.ones((8, 128))), 2.0)
        assert fuser.push_block_spec(double_p.bind, spec)(SDS((16, 128), F32)) is spec
    finally:
        for table in (fuser.pull_block_spec_rules, fuser.eval_rules,
                      fuser.push_block_spec_rules):
            table.pop(double_p, None)


def test_custom_fusion_is_inlined_inside_kernels_with_its_pallas_impl():
    @fuser.custom_fusion
    def plus_one(x):
        return x + 1.0

    plus_one.def_pull_block_spec(lambda ts: ts)
    plus_one.def_eval_rule(lambda ctx, x: (plus_one(x),))
    plus_one.def_pallas_impl(lambda x: x + 1.0 + 0.0 * x)

    def kernel(x_ref, o_ref):
        o_ref[...] = plus_one(x_ref[...])

    x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
    out = pl.pallas_call(kernel, SDS(x.shape, F32), interpret=True)(x)
    np.testing.assert_array_equal(out, x + 1.0)
    jaxpr = jax.make_jaxpr(pl.pallas_call(kernel, SDS(x.shape, F32), interpret=True))(x)
    kernel_jaxpr = jaxpr.eqns[0].params["jaxpr"]
    assert "custom_fusion" not in {e.primitive.name for e in kernel_jaxpr.eqns}
    assert "custom_fusion" in str(jax.make_jaxpr(plus_one)(x))  # outside kernels: a primitive


def test_compare_jaxprs_orders_effects_per_ref():
    def read_then_write(x):
        r = jax.new_ref(x)
        a = r[...]
        r[...] = x * 2
        return a + r[...]

    def write_then_read(x):
        r = jax.new_ref(x)
        r[...] = x * 2
        a = r[...]
        return a + r[...]

    j1 = jax.make_jaxpr(read_then_write)(1.0)
    j2 = jax.make_jaxpr(write_then_read)(1.0)
    assert fuser.compare_jaxprs(j1, j1) and not fuser.compare_jaxprs(j1, j2)
