"""``pallas_call``: its arguments and what each one means, checked against plain JAX.

Every kernel here runs under the interpreter (``interpret=True``) on CPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl

SDS = jax.ShapeDtypeStruct


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


# --------------------------------------------------------------------------------------
# grid


def test_no_grid_runs_the_kernel_once_on_whole_arrays():
    x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)
    y = jnp.ones((4, 8), jnp.float32)
    out = pl.pallas_call(_add_kernel, SDS(x.shape, x.dtype), interpret=True)(x, y)
    np.testing.assert_array_equal(out, x + y)


@pytest.mark.parametrize("grid", [3, (3,), [3]])
def test_grid_may_be_an_int_tuple_or_list(grid):
    x = jnp.arange(24, dtype=jnp.float32).reshape(3, 8)
    spec = pl.BlockSpec((1, 8), lambda i: (i, 0))
    out = pl.pallas_call(
        _copy_kernel, SDS(x.shape, x.dtype), grid=grid, in_specs=[spec], out_specs=spec,
        interpret=True,
    )(x)
    np.testing.assert_array_equal(out, x)


def test_two_dimensional_grid_tiles_both_axes():
    x = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
    spec = pl.BlockSpec((2, 4), lambda i, j: (i, j))

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2 + pl.program_id(0) * 100 + pl.program_id(1)

    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype), grid=(4, 4), in_specs=[spec], out_specs=spec,
        interpret=True,
    )(x)
    rows = np.arange(8)[:, None] // 2
    cols = np.arange(16)[None, :] // 4
    np.testing.assert_array_equal(out, np.asarray(x) * 2 + rows * 100 + cols)


def test_grid_with_a_zero_size_axis_runs_no_kernel_and_keeps_aliased_output():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype), grid=(0,),
        in_specs=[pl.BlockSpec((8,), lambda i: (0,))],
        out_specs=pl.BlockSpec((8,), lambda i: (0,)),
        input_output_aliases={0: 0}, interpret=True,
    )(x)
    np.testing.assert_array_equal(out, x)


def test_matmul_with_k_reduction_over_the_last_grid_axis():
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((16, 32)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((32, 24)), jnp.float32)
    bm, bn, bk = 8, 8, 8

    def kernel(a_ref, b_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    out = pl.pallas_call(
        kernel, SDS((16, 24), jnp.float32), grid=(2, 3, 4),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        interpret=True,
    )(a, b)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(b), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------
# in_specs / out_specs pytrees, GridSpec


def test_in_specs_follow_a_nested_input_pytree():
    a = jnp.arange(16, dtype=jnp.float32).reshape(2, 8)
    b = {"u": jnp.ones((2, 8), jnp.float32), "v": jnp.full((2, 8), 3.0, jnp.float32)}

    def kernel(a_ref, b_refs, o_ref):
        o_ref[...] = a_ref[...] * b_refs["v"][...] + b_refs["u"][...]

    row = pl.BlockSpec((1, 8), lambda i: (i, 0))
    out = pl.pallas_call(
        kernel, SDS((2, 8), jnp.float32), grid=(2,),
        in_specs=(row, {"u": row, "v": row}), out_specs=row, interpret=True,
    )(a, b)
    np.testing.assert_array_equal(out, a * 3 + 1)


def test_grid_spec_is_equivalent_to_grid_and_specs():
    x = jnp.arange(64, dtype=jnp.float32).reshape(8, 8)
    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    gs = pl.GridSpec(grid=(4,), in_specs=[spec], out_specs=spec)
    a = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), grid_spec=gs, interpret=True)(x)
    b = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), grid=(4,), in_specs=[spec],
                       out_specs=spec, interpret=True)(x)
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, x)


def test_grid_spec_and_grid_together_are_rejected():
    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    gs = pl.GridSpec(grid=(4,), in_specs=[spec], out_specs=spec)
    with pytest.raises(ValueError, match="either grid_spec or grid"):
        pl.pallas_call(_copy_kernel, SDS((8, 8), jnp.float32), grid_spec=gs, grid=(4,),
                       interpret=True)


def test_prefetch_scalar_grid_spec_feeds_index_maps_and_kernel():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)
    order = jnp.array([3, 0, 2, 1], jnp.int32)

    def kernel(order_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + order_ref[pl.program_id(0)].astype(jnp.float32)

    gs = pl.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,),
        in_specs=[pl.BlockSpec((1, 8), lambda i, order: (order[i], 0))],
        out_specs=pl.BlockSpec((1, 8), lambda i, order: (i, 0)),
    )
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid_spec=gs, interpret=True)(order, x)
    expected = np.asarray(x)[np.asarray(order)] + np.asarray(order)[:, None]
    np.testing.assert_array_equal(out, expected)


def test_scalar_prefetch_arguments_may_be_pytrees_or_none():
    """As upstream: each scalar-prefetch argument is a pytree (``None`` included), and the
    index maps and the kernel receive their refs grouped the same way (splash attention
    passes an optional table as ``None``)."""
    x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)
    order = jnp.array([3, 1, 2, 0], jnp.int32)
    scale = {"a": jnp.array([2], jnp.int32)}
    seen = []

    def index_map(i, order_ref, missing, scale_refs):
        seen.append((missing, sorted(scale_refs)))
        return order_ref[i], 0

    def kernel(order_ref, missing, scale_refs, x_ref, o_ref):
        assert missing is None
        o_ref[...] = x_ref[...] * scale_refs["a"][0].astype(jnp.float32)

    gs = pl.PrefetchScalarGridSpec(
        num_scalar_prefetch=3, grid=(4,),
        in_specs=[pl.BlockSpec((1, 8), index_map)],
        out_specs=pl.BlockSpec((1, 8), lambda i, *_: (i, 0)),
    )
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid_spec=gs,
                         interpret=True)(order, None, scale, x)
    np.testing.assert_array_equal(out, np.asarray(x)[np.asarray(order)] * 2)
    assert seen == [(None, ["a"])]


def test_scalar_prefetch_operands_count_in_input_output_aliases():
    x = jnp.arange(8, dtype=jnp.float32).reshape(4, 2)
    rows = jnp.array([2, 0], jnp.int32)

    def kernel(rows_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * -1

    gs = pl.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(2,),
        in_specs=[pl.BlockSpec((1, 2), lambda i, rows: (rows[i], 0))],
        out_specs=pl.BlockSpec((1, 2), lambda i, rows: (rows[i], 0)),
    )
    # operand 1 (x, after the prefetch operand) is aliased to output 0
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid_spec=gs,
                         input_output_aliases={1: 0}, interpret=True)(rows, x)
    expected = np.asarray(x).copy()
    expected[[0, 2]] *= -1
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------------------
# out_shape pytrees


def test_out_shape_single_returns_a_single_array():
    x = jnp.arange(8, dtype=jnp.float32)
    out = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), interpret=True)(x)
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(out, x)


def test_out_shape_tuple_gives_one_output_ref_each():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o1_ref, o2_ref):
        o1_ref[...] = x_ref[...] + 1
        o2_ref[...] = (x_ref[...] * 2).astype(jnp.int32)

    o1, o2 = pl.pallas_call(
        kernel, (SDS((8,), jnp.float32), SDS((8,), jnp.int32)), interpret=True
    )(x)
    np.testing.assert_array_equal(o1, x + 1)
    assert o2.dtype == jnp.int32
    np.testing.assert_array_equal(o2, (np.asarray(x) * 2).astype(np.int32))


def test_out_shape_dict_gives_a_dict_of_output_refs():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, outs):
        outs["sum"][...] = jnp.sum(x_ref[...], keepdims=True)
        outs["neg"][...] = -x_ref[...]

    out = pl.pallas_call(
        kernel, {"neg": SDS((8,), jnp.float32), "sum": SDS((1,), jnp.float32)},
        interpret=True,
    )(x)
    assert set(out) == {"neg", "sum"}
    np.testing.assert_array_equal(out["neg"], -x)
    np.testing.assert_array_equal(out["sum"], [np.sum(np.asarray(x))])


def test_out_shape_accepts_arrays_as_shape_and_dtype():
    x = jnp.arange(8, dtype=jnp.float32)
    out = pl.pallas_call(_copy_kernel, x, interpret=True)(x)
    np.testing.assert_array_equal(out, x)


def test_out_specs_match_a_tuple_out_shape():
    x = jnp.arange(16, dtype=jnp.float32).reshape(2, 8)

    def kernel(x_ref, rows_ref, total_ref):
        rows_ref[...] = x_ref[...] * 10

        @pl.when(pl.program_id(0) == 0)
        def _():
            total_ref[...] = jnp.zeros_like(total_ref)

        total_ref[...] += x_ref[...]

    row = pl.BlockSpec((1, 8), lambda i: (i, 0))
    acc = pl.BlockSpec((1, 8), lambda i: (0, 0))
    rows, total = pl.pallas_call(
        kernel, (SDS((2, 8), jnp.float32), SDS((1, 8), jnp.float32)), grid=(2,),
        in_specs=[row], out_specs=(row, acc), interpret=True,
    )(x)
    np.testing.assert_array_equal(rows, x * 10)
    np.testing.assert_array_equal(total, np.sum(np.asarray(x), axis=0, keepdims=True))


def test_out_shape_list_returns_a_tuple_as_upstream():
    # Upstream's tpu_pallas_test (test_with_unhashable_grid_spec) checks this.
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, a_ref, b_ref):
        a_ref[...] = x_ref[...] + 1
        b_ref[...] = x_ref[...] + 2

    out = pl.pallas_call(kernel, [SDS((4,), jnp.float32)] * 2, interpret=True)(x)
    assert isinstance(out, tuple) and len(out) == 2
    np.testing.assert_array_equal(out[1], x + 2)


def test_zero_dimensional_inputs_are_passed_as_scalar_refs():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(s_ref, x_ref, o_ref):
        assert s_ref.shape == ()
        o_ref[...] = x_ref[...] * s_ref[...]

    spec = pl.BlockSpec((4,), lambda i: (i,))
    out = pl.pallas_call(kernel, SDS((8,), jnp.float32), grid=(2,),
                         in_specs=[pl.no_block_spec, spec], out_specs=spec,
                         interpret=True)(jnp.float32(3), x)
    np.testing.assert_array_equal(out, x * 3)


@pytest.mark.parametrize("interpret", [True, pl.InterpretParams(vectorize=False)],
                         ids=["default", "sequential"])
def test_zero_dimensional_outputs(interpret):
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sum(x_ref[...])

    out = pl.pallas_call(kernel, SDS((), jnp.float32), interpret=interpret)(x)
    assert out.shape == ()
    np.testing.assert_array_equal(out, 6.0)


# --------------------------------------------------------------------------------------
# scratch_shapes


def test_scratch_shapes_are_passed_after_outputs():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)

    def kernel(x_ref, o_ref, s_ref, t_ref):
        s_ref[...] = x_ref[...] * 2
        t_ref[...] = jnp.ones_like(t_ref)
        o_ref[...] = s_ref[...] + t_ref[0, :].astype(jnp.float32)

    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype),
        scratch_shapes=[pl.ANY((8, 128), jnp.float32), pl.MemoryRef(
            jax.core.ShapedArray((2, 128), jnp.int32), pl.MemorySpace.ANY)],
        interpret=True,
    )(x)
    np.testing.assert_array_equal(out, x * 2 + 1)


def test_scratch_shapes_may_be_a_dict_passed_by_keyword():
    # As upstream: a dict of scratch shapes becomes keyword arguments of the kernel.
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o_ref, *, tmp):
        tmp[...] = x_ref[...] + 1
        o_ref[...] = tmp[...] * 3

    out = pl.pallas_call(
        kernel, SDS(x.shape, x.dtype), scratch_shapes={"tmp": pl.ANY((8,), jnp.float32)},
        interpret=True,
    )(x)
    np.testing.assert_array_equal(out, (x + 1) * 3)


# --------------------------------------------------------------------------------------
# input_output_aliases


def test_aliased_output_starts_as_its_input():
    x = jnp.arange(16, dtype=jnp.float32).reshape(4, 4)

    def kernel(x_ref, o_ref):
        # Write only row 1; the other rows keep the input's values.
        o_ref[1, :] = x_ref[1, :] * 100

    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), input_output_aliases={0: 0},
                         interpret=True)(x)
    expected = np.asarray(x).copy()
    expected[1] *= 100
    np.testing.assert_array_equal(out, expected)


def test_aliasing_the_second_input_to_the_second_output():
    a = jnp.ones((8,), jnp.float32)
    b = jnp.arange(8, dtype=jnp.int32)

    def kernel(a_ref, b_ref, o1_ref, o2_ref):
        o1_ref[...] = a_ref[...] * 2
        o2_ref[pl.ds(0, 2)] = jnp.full((2,), -1, jnp.int32)

    o1, o2 = pl.pallas_call(
        kernel, (SDS((8,), jnp.float32), SDS((8,), jnp.int32)),
        input_output_aliases={1: 1}, interpret=True,
    )(a, b)
    np.testing.assert_array_equal(o1, 2 * np.ones(8))
    np.testing.assert_array_equal(o2, [-1, -1, 2, 3, 4, 5, 6, 7])


def test_aliased_operand_is_not_modified_outside_jit():
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), input_output_aliases={0: 0},
                         interpret=True)(x)
    np.testing.assert_array_equal(out, [1, 2, 3, 4])
    np.testing.assert_array_equal(x, [0, 1, 2, 3])


# --------------------------------------------------------------------------------------
# name, cost_estimate, compiler_params, interpret


def test_name_replaces_the_kernel_name_in_debug_output(capsys):
    x = jnp.arange(8, dtype=jnp.float32)
    f = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), name="my_copy_kernel",
                       debug=True, interpret=True)
    np.testing.assert_array_equal(f(x), x)
    out = capsys.readouterr().out
    assert "pallas_call my_copy_kernel" in out
    assert "pallas_call _copy_kernel" not in out


def test_default_name_is_the_kernel_function_and_its_location(capsys):
    x = jnp.arange(8, dtype=jnp.float32)
    pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), debug=True, interpret=True)(x)
    assert "pallas_call _copy_kernel at test_pallas_call.py:" in capsys.readouterr().out


def test_metadata_is_accepted():
    x = jnp.arange(8, dtype=jnp.float32)
    out = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), metadata={"owner": "tests"},
                         interpret=True)(x)
    np.testing.assert_array_equal(out, x)


def test_cost_estimate_is_accepted_and_does_not_change_results():
    x = jnp.arange(8, dtype=jnp.float32)
    cost = pl.CostEstimate(flops=8, transcendentals=0, bytes_accessed=64)
    out = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), cost_estimate=cost,
                         interpret=True)(x)
    np.testing.assert_array_equal(out, x)
    assert b'"flops": 8' in cost.to_json()


def test_estimate_cost_of_a_plain_jax_function():
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    cost = pl.estimate_cost(lambda a: a @ a, x)
    assert isinstance(cost, pl.CostEstimate)
    assert cost.flops >= 2 * 64**3 - 64**2  # a dot of two 64x64 matrices
    assert cost.bytes_accessed > 0


@dataclasses.dataclass(frozen=True)
class _UninstalledParams(pl.CompilerParams):
    BACKEND: ClassVar[str] = "not_installed_backend"
    knob: int = 1


def test_compiler_params_of_an_uninstalled_backend_are_fine_under_interpret():
    x = jnp.arange(8, dtype=jnp.float32)
    out = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype),
                         compiler_params=_UninstalledParams(), interpret=True)(x)
    np.testing.assert_array_equal(out, x)


def test_compiler_params_select_their_backend_and_fail_early_when_missing():
    with pytest.raises(ValueError, match="'not_installed_backend' is not installed"):
        pl.pallas_call(_copy_kernel, SDS((8,), jnp.float32),
                       compiler_params=_UninstalledParams())


def test_interpret_params_are_accepted_as_interpret():
    x = jnp.arange(8, dtype=jnp.float32)
    out = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype),
                         interpret=pl.InterpretParams())(x)
    np.testing.assert_array_equal(out, x)


def test_without_interpret_on_cpu_the_builtin_interpret_backend_runs_the_kernel():
    # The built-in "interpret" backend is registered for platform "cpu".
    x = jnp.arange(8, dtype=jnp.float32)
    out = pl.pallas_call(_add_kernel, SDS(x.shape, x.dtype))(x, x)
    np.testing.assert_array_equal(out, 2 * x)


# --------------------------------------------------------------------------------------
# composition with JAX transformations


def test_pallas_call_under_jit_equals_eager():
    x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8)
    spec = pl.BlockSpec((2, 8), lambda i: (i, 0))
    f = pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., jnp.sin(x_ref[...])),
        SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec], out_specs=spec, interpret=True,
    )
    np.testing.assert_allclose(jax.jit(f)(x), f(x))
    np.testing.assert_allclose(f(x), np.sin(np.asarray(x)), rtol=1e-6)


def test_pallas_call_result_has_the_declared_abstract_value():
    f = pl.pallas_call(_copy_kernel, SDS((4, 8), jnp.bfloat16), interpret=True)
    out = jax.eval_shape(f, SDS((4, 8), jnp.bfloat16))
    assert out.shape == (4, 8) and out.dtype == jnp.bfloat16


def test_kernel_reading_a_python_scalar_closure():
    x = jnp.arange(8, dtype=jnp.float32)
    scale = 3.0

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * scale

    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), interpret=True)(x)
    np.testing.assert_array_equal(out, x * 3)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.int8, jnp.bool_])
def test_copy_preserves_every_dtype(dtype):
    x = (jnp.arange(16) % 3).astype(dtype).reshape(2, 8)
    spec = pl.BlockSpec((1, 8), lambda i: (i, 0))
    out = pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), grid=(2,), in_specs=[spec],
                         out_specs=spec, interpret=True)(x)
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, x)


def test_a_kernel_can_be_a_functools_partial():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o_ref, *, offset):
        o_ref[...] = x_ref[...] + offset

    out = pl.pallas_call(functools.partial(kernel, offset=5.0), SDS(x.shape, x.dtype),
                         interpret=True)(x)
    np.testing.assert_array_equal(out, x + 5)


# --------------------------------------------------------------------------------------
# Scalar-prefetch operands that are pytrees (as upstream: the fuser passes one tuple of
# prefetch values per fusion).


def test_scalar_prefetch_operands_may_be_pytrees_for_kernel_and_index_maps():
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(32, 128)
    starts = (jnp.array([2], jnp.int32), {"row": jnp.array([1], jnp.int32)})

    def kernel(pf_a, pf_b, empty, x_ref, o_ref):
        assert empty == ()
        o_ref[...] = x_ref[...] + pf_a[0].astype(jnp.float32) + pf_b["row"][0]

    spec = pl.BlockSpec((8, 128), lambda i, a, b, e: (b["row"][0] + i, 0))
    out = pl.pallas_call(
        kernel, jax.ShapeDtypeStruct((16, 128), jnp.float32),
        grid_spec=pl.PrefetchScalarGridSpec(3, grid=(2,), in_specs=[spec],
                                            out_specs=pl.BlockSpec((8, 128), lambda i, *_: (i, 0))),
        interpret=True,
    )(starts[0], starts[1], (), x)
    np.testing.assert_array_equal(out, x[8:24] + 3.0)


def test_index_maps_ignoring_scalar_prefetch_pass_jax_enable_checks():
    x = jnp.ones((16, 128), jnp.float32)

    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + s_ref[0]

    spec = pl.BlockSpec((8, 128), lambda i, s: (i, 0))
    f = pl.pallas_call(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype),
                       grid_spec=pl.PrefetchScalarGridSpec(1, grid=(2,), in_specs=[spec],
                                                           out_specs=spec))
    with jax.enable_checks(True):
        out = jax.jit(f)(jnp.array([3], jnp.int32), x)
    np.testing.assert_array_equal(out, 4.0)


def test_outputs_varying_over_shard_map_axes_pass_jax_enable_checks():
    # jax_enable_checks re-derives the call's output types: they vary over the manual
    # axes of the operands, as they did when the call was traced.
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    x = jnp.ones((8, 128), jnp.float32)

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    def inner(x):
        return pl.pallas_call(lambda x_ref, y_ref: y_ref.__setitem__(..., x_ref[...] * 2),
                              out_shape=jax.typeof(x), interpret=True)(x)

    with jax.enable_checks(True):
        np.testing.assert_array_equal(inner(x), 2.0)


def test_the_call_has_ahead_of_time_stages_as_a_jitted_function():
    # Upstream's pallas_call returns a jitted function: .lower(...).compile(), .trace
    # and .eval_shape work on it, for a call without operands too.
    f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                       out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), interpret=True)
    x = jnp.ones((8, 128), jnp.float32)
    np.testing.assert_array_equal(f.lower(x).compile()(x), 2.0)
    assert f.eval_shape(x) == jax.ShapeDtypeStruct((8, 128), jnp.float32)
    assert "pallas_call" in str(f.trace(x).jaxpr)
    g = pl.pallas_call(lambda o_ref: o_ref.__setitem__(..., jnp.ones((8, 128))),
                       out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), interpret=True)
    np.testing.assert_array_equal(g.lower().compile()(), 1.0)
    # The stages stay the call's own: a vmap of it (functools.wraps copies a function's
    # __dict__) exports the batched call.
    xs = jnp.ones((3, 8, 128), jnp.float32)
    exp = jax.export.export(jax.jit(jax.vmap(f)), platforms=["cpu"])(xs)
    np.testing.assert_array_equal(exp.call(xs), 2.0)


def test_grid_env_gives_program_id_and_num_programs_their_values():
    # pallas.core.grid_env: a kernel body traced inside another loop says where in the
    # grid it stands (upstream's jax._src.pallas.core.grid_env).
    import pallas.core as pallas_core

    def kernel(o_ref):
        with pallas_core.grid_env([pallas_core.GridAxis(jnp.int32(5), 7)]):
            o_ref[0] = pl.program_id(0) * 10 + pl.num_programs(0)

    out = pl.pallas_call(kernel, jax.ShapeDtypeStruct((1,), jnp.int32), grid=(2,),
                         out_specs=pl.BlockSpec((1,), lambda i: (0,)), interpret=True)()
    assert int(out[0]) == 57


def test_pallas_core_holds_the_names_upstream_keeps_in_its_core_module():
    # Code written against upstream's jax._src.pallas.core (e.g. its shape-polymorphism
    # tests: core.pallas_export_experimental) finds the same objects in pallas.core.
    import pallas.core as pallas_core

    assert pallas_core.pallas_export_experimental is pl.pallas_export_experimental
    assert pallas_core.BlockSpec is pl.BlockSpec and pallas_core.GridSpec is pl.GridSpec
