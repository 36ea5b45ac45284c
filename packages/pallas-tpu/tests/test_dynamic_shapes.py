"""Dynamic-shape export on Mosaic TPU: symbolic block shapes (``jax.export`` under
``pl.pallas_export_experimental(dynamic_shapes=True)``).

As upstream emits them: each symbolic dimension is a placeholder size counting down from
``2**31 - 1`` in the Mosaic module, and two module attributes per placeholder tell the
TPU runtime how to compute it (a StableHLO function of the dimension variables) and where
the operands carry those variables.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export

import pallas as pl
from pallas_tpu.inspect import mosaic_modules

SDS = jax.ShapeDtypeStruct
P0, P1 = 2**31 - 1, 2**31 - 2


def _halves(x):
    """A (2, 2) grid of blocks of half the array in each dimension."""
    block = (x.shape[0] // 2, x.shape[1] // 2)
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
                          SDS(x.shape, x.dtype), grid=(2, 2), in_specs=[spec],
                          out_specs=spec, backend="mosaic_tpu")(x)


def _export(f, *avals):
    with pl.pallas_export_experimental(dynamic_shapes=True):
        return export.export(jax.jit(f), platforms=["tpu"])(*avals)


def _main(module):
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            return op
    raise AssertionError("no @main")


def _halved_dims():
    return export.symbolic_shape(
        "w, h", constraints=("mod(floordiv(w, 2), 8) == 0", "mod(floordiv(h, 2), 128) == 0"))


def test_symbolic_block_sizes_are_placeholders_in_the_mosaic_module():
    w, h = _halved_dims()
    exp = _export(_halves, SDS((w, h), jnp.float32))
    (m,) = mosaic_modules(exp)
    bounds = [str(wp["window_bounds"]) for wp in _main(m).attributes["window_params"]]
    assert bounds == [f"array<i64: {P0}, {P1}>"] * 2
    assert f"memref<{P0}x{P1}xf32, #tpu.memory_space<vmem>>" in str(_main(m).type)


def test_each_placeholder_says_how_the_runtime_computes_it():
    w, h = _halved_dims()
    (m,) = mosaic_modules(_export(_halves, SDS((w, h), jnp.float32)))
    attrs = m.operation.attributes
    # The dimension variables in sorted order (h, w), found in operand 0's dims 1 and 0.
    where = ("[{dimension_index = 1 : i64, operand_index = 0 : i64}, "
             "{dimension_index = 0 : i64, operand_index = 0 : i64}]")
    for p in (P0, P1):
        assert str(attrs[f"tpu.dynamic_dimension_mapping_indices_{p}"]) == where
        module = str(attrs[f"tpu.dynamic_dimension_mapping_module_{p}"])
        assert "func.func public @main(%arg0: tensor<i32>" in module
        assert "%arg1: tensor<i32>" in module and "stablehlo" in module


def test_a_kernel_slicing_by_a_symbolic_size_exports():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[: pl.cdiv(x_ref.shape[0], 2)]

    def f(x):
        out = SDS((pl.cdiv(x.shape[0], 2), 128), x.dtype)
        return pl.pallas_call(kernel, out, backend="mosaic_tpu")(x)

    (m,) = export.symbolic_shape("m")
    exp = _export(f, SDS((m, 128), jnp.float32))
    (mod,) = mosaic_modules(exp)
    text = str(mod)
    assert f"memref<{P0}x128xf32" in text and f"memref<{P1}x128xf32" in text
    assert f"vector<{P1}x128xf32>" in text  # the loaded half: cdiv(m, 2) rows


def test_a_dimension_used_as_a_value_is_its_placeholder():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + x_ref.shape[1]

    def f(x):
        spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
        return pl.pallas_call(kernel, SDS(x.shape, jnp.int32), grid=(4,), in_specs=[spec],
                              out_specs=spec, backend="mosaic_tpu")(x)

    (n,) = export.symbolic_shape("n", constraints=("mod(n, 128) == 0",))
    (mod,) = mosaic_modules(_export(f, SDS((32, n), jnp.int32)))
    assert f"arith.constant {P0} : i32" in str(mod)


def test_symbolic_blocks_need_the_dynamic_shapes_switch():
    w, h = _halved_dims()
    with pytest.raises(ValueError, match=r"pallas_export_experimental\(dynamic_shapes=True\)"):
        export.export(jax.jit(_halves), platforms=["tpu"])(SDS((w, h), jnp.float32))


def test_a_dimension_variable_that_is_only_a_grid_size_is_found_at_its_operand():
    def f(x, like_grid):
        g = like_grid.shape[0]
        spec = pl.BlockSpec((x.shape[0] // g, 128), lambda i: (i, 0))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                              SDS(x.shape, x.dtype), grid=(g,), in_specs=[spec],
                              out_specs=spec, backend="mosaic_tpu")(x)

    m, g = export.symbolic_shape("m, g", constraints=("mod(floordiv(m, g), 8) == 0",))
    (mod,) = mosaic_modules(_export(f, SDS((m, 128), jnp.float32), SDS((g,), jnp.float32)))
    # Sorted variables (g, m): g is the grid size operand 0, m is dim 0 of x (operand 1).
    assert str(mod.operation.attributes[f"tpu.dynamic_dimension_mapping_indices_{P0}"]) == (
        "[{dimension_index = -1 : i64, operand_index = 0 : i64}, "
        "{dimension_index = 0 : i64, operand_index = 1 : i64}]")
