"""Lowering to Mosaic GPU: kernels become the ``mosaic_gpu_v2`` custom call for cuda,
export, and say clearly what they cannot lower."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.lowering import MosaicGpuLoweringError, build
from pallas_mosaic_gpu._src.lowering.kernel import split_grid

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32


def _sds(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _call(kernel, out_shape, **kw):
    return pl.pallas_call(kernel, out_shape=out_shape, backend="mosaic_gpu", **kw)


def _lower(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _eqn_params(f, *args):
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    return eqn.params


def _blocked_add():
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...]) - y_ref[...] * 2.0

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return _call(kernel, _sds((32, 128)), grid=(4,), in_specs=[spec, spec], out_specs=spec)


def test_a_blocked_kernel_lowers_to_one_mosaic_gpu_custom_call():
    x = jnp.zeros((32, 128), F32)
    text = _lower(_blocked_add(), x, x)
    assert text.count("custom_call @mosaic_gpu_v2") == 1


def test_export_for_cuda_needs_no_waiver():
    x = jnp.zeros((32, 128), F32)
    exp = jax.export.export(jax.jit(_blocked_add()), platforms=["cuda"])(x, x)
    assert exp.platforms == ("cuda",)
    assert "mosaic_gpu_v2" in exp.mlir_module()


def test_parallel_axes_become_the_cuda_grid_and_reduction_axes_a_loop():
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    f = _call(kernel, _sds((16, 128)), grid=(2, 3),
              in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, k))],
              out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)))
    x = jnp.zeros((16, 384), F32)
    p = _eqn_params(f, x)
    assert split_grid(p["grid_mapping"], None) == ((0,), (1,))
    k = build(p["jaxpr"], p["grid_mapping"], plgpu.CompilerParams(), "acc")
    assert k.cuda_grid == (2, 1, 1) and k.sequential_axes == (1,)
    assert "custom_call @mosaic_gpu_v2" in _lower(f, x)


def test_dimension_semantics_override_the_split():
    f = _blocked_add()
    x = jnp.zeros((32, 128), F32)
    p = _eqn_params(f, x, x)
    params = plgpu.CompilerParams(dimension_semantics=["sequential"])
    k = build(p["jaxpr"], p["grid_mapping"], params, "seq")
    assert k.cuda_grid == (1, 1, 1) and k.sequential_axes == (0,)
    with pytest.raises(ValueError, match="names 2 axes but the grid"):
        build(p["jaxpr"], p["grid_mapping"],
              plgpu.CompilerParams(dimension_semantics=["parallel", "parallel"]), "bad")


def test_loops_conditionals_and_full_reductions_lower():
    def kernel(x_ref, o_ref):
        x = x_ref[...]

        def body(i, acc):
            return acc + jnp.where(x > 0, x, -x) * i.astype(F32)

        acc = jax.lax.fori_loop(0, 3, body, jnp.zeros_like(x))
        total = jnp.sum(acc)
        o_ref[...] = jax.lax.cond(total > 0, lambda: acc / total, lambda: acc)

    f = _call(kernel, _sds((8, 128)))
    assert "custom_call @mosaic_gpu_v2" in _lower(f, jnp.zeros((8, 128), F32))


def test_an_unsupported_primitive_fails_at_trace_time_naming_it_and_the_backend():
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.sort(x_ref[...], dimension=1)

    f = _call(kernel, _sds((8, 128)))
    with pytest.raises(MosaicGpuLoweringError, match="mosaic_gpu.*'sort'"):
        jax.make_jaxpr(f)(jnp.zeros((8, 128), F32))


def test_bool_operands_travel_as_int8():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.logical_not(x_ref[...])

    f = _call(kernel, _sds((8, 128), jnp.bool_))
    x = jnp.zeros((8, 128), jnp.bool_)
    p = _eqn_params(f, x)
    k = build(p["jaxpr"], p["grid_mapping"], None, "not")
    assert [s.dtype for s in (*k.in_shapes, *k.out_shapes)] == [jnp.int8, jnp.int8]
    text = _lower(f, x)
    assert "custom_call @mosaic_gpu_v2" in text and "tensor<8x128xi1>" in text


def test_dot_general_lowers_with_transposes_and_batch_dims():
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jax.lax.dot_general(a_ref[...], b_ref[...], (((2,), (2,)), ((0,), (0,))),
                                         preferred_element_type=F32)

    f = _call(kernel, _sds((2, 16, 8)))
    a, b = jnp.zeros((2, 16, 32), jnp.bfloat16), jnp.zeros((2, 8, 32), jnp.bfloat16)
    p = _eqn_params(f, a, b)
    k = build(p["jaxpr"], p["grid_mapping"], None, "bmm")
    assert "dot_general" in k.primitives
    assert "custom_call @mosaic_gpu_v2" in _lower(f, a, b)


def test_arrays_the_warpgroup_cannot_hold_are_refused_with_their_shape():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    f = _call(kernel, _sds((16, 10)))
    with pytest.raises(MosaicGpuLoweringError, match=r"\(16, 10\).*multiple of 128.*64"):
        jax.make_jaxpr(f)(jnp.zeros((16, 10), F32))


def test_row_reductions_make_small_arrays_held_by_every_thread():
    def kernel(x_ref, o_ref, m_ref):
        x = x_ref[...]
        m = jnp.max(x, axis=1, keepdims=True)  # (8, 1): every thread holds it whole
        e = jnp.exp(x - m)
        o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True)
        m_ref[...] = m

    f = _call(kernel, (_sds((8, 128)), _sds((8, 1))))
    x = jnp.zeros((8, 128), F32)
    p = _eqn_params(f, x)
    k = build(p["jaxpr"], p["grid_mapping"], None, "softmax")
    assert {"reduce_max", "reduce_sum", "broadcast_in_dim"} <= k.primitives
    assert "custom_call @mosaic_gpu_v2" in _lower(f, x)


def test_implicit_broadcasts_cumulative_ops_and_concatenation_lower():
    def kernel(row_ref, col_ref, o_ref, c_ref):
        row = row_ref[...].astype(jnp.int32)  # (1, 128), computed: read through SMEM
        o_ref[...] = col_ref[...].astype(jnp.int32) * 1000 + row
        both = jnp.concatenate([o_ref[...], o_ref[...]], axis=1)
        c_ref[...] = jax.lax.cumsum(both, axis=1)

    f = _call(kernel, (_sds((8, 128), jnp.int32), _sds((8, 256), jnp.int32)))
    row, col = jnp.zeros((1, 128), jnp.int8), jnp.zeros((8, 1), jnp.int8)
    p = _eqn_params(f, row, col)
    k = build(p["jaxpr"], p["grid_mapping"], None, "mix")
    assert {"cumsum", "concatenate", "add"} <= k.primitives
    assert "custom_call @mosaic_gpu_v2" in _lower(f, row, col)


def test_is_signed_of_4_bit_integers():
    """int4/uint4 are integers for FragmentedArray's ``is_signed`` (numpy's kind of the
    ml_dtypes types is "V"; loading an int4 block raised 'is_signed must be non-None ...
    for i4')."""
    from pallas_mosaic_gpu._src.lowering import values as V

    assert V.signed(jnp.int4) is True and V.signed(jnp.uint4) is False
    assert V.signed(jnp.int8) is True and V.signed(jnp.float32) is None
