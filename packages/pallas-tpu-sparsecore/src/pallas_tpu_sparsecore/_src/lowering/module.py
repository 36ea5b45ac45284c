"""Builds the Mosaic module of a SparseCore kernel and its ``tpu_custom_call``.

A ``pl.kernel`` over a SparseCore mesh becomes one ``func.func @main`` taking one i32
per mesh axis (the core and, on vector subcores, the subcore index), then every operand
whole (HBM) and the scratch buffers. Its attributes say what runs it:
``tpu.core_type = #tpu.core_type<sc_vector_subcore>`` (or ``sc_scalar_subcore``),
``iteration_bounds`` = the mesh shape, ``dimension_semantics`` = core_parallel (and
subcore_parallel), trivial ``window_params`` (``transform_indices`` of all zeros, as the
SparseCore compiler expects) and ``scratch_operands``. JAX's Mosaic packaging reads the
core type and marks the custom call ``DEVICE_TYPE_SPARSECORE``.
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from pallas_tpu import CoreType, MemorySpace
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.info import SparseCoreInfo, current_chip
from pallas_tpu_sparsecore._src.lowering import rules as _rules  # (also registers)
from pallas_tpu_sparsecore._src.lowering.table import RULES

BACKEND = "mosaic_sparsecore"


@dataclasses.dataclass
class SparseCoreKernel:
    module: ir.Module
    context: ir.Context
    core_type: CoreType
    primitives: frozenset


def core_type_of(gm) -> CoreType:
    """Vector subcores for a 2-axis mesh grid, the scalar subcore for a 1-axis one."""
    return CoreType.SC_VECTOR_SUBCORE if len(gm.grid) == 2 else CoreType.SC_SCALAR_SUBCORE


def _operand_space(bm):
    space = bm.memory_space
    if space is None or tpx.is_any_space(space):
        return MemorySpace.HBM
    return tpx.types.space_of(space)


def _check_core_count(core_type: CoreType, grid: tuple, info: SparseCoreInfo,
                      name: str) -> None:
    """libtpu compiles a scalar-subcore kernel over one SparseCore or all of them (v5p:
    1 or 4; 2 and 3 are 'Core-parallel dimension must be less than or equal to the
    number of active cores'), so other counts are refused before it."""
    cores = grid[0]
    if core_type is CoreType.SC_SCALAR_SUBCORE and cores not in (1, info.num_cores):
        raise tpx.MosaicUnsupported(
            f"{name}: a scalar-subcore kernel over {cores} SparseCores of TPU "
            f"{current_chip()}: the SparseCore compiler runs scalar subcores on one "
            f"SparseCore or on all {info.num_cores}; valid mesh sizes: 1 or "
            f"{info.num_cores} (plsc.ScalarSubcoreMesh(num_cores=...))")


def build_module(jaxpr, gm, name: str, info: SparseCoreInfo) -> SparseCoreKernel:
    """Lowers the kernel jaxpr of a SparseCore mesh kernel to a verified module."""
    core_type = core_type_of(gm)
    _check_core_count(core_type, tuple(gm.grid), info, name)
    ctx = tpx.new_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            operands = []
            for bm in gm.block_mappings:
                shape = tuple(bm.array_aval.shape)
                space = _operand_space(bm)
                operands.append((tpx.types.memref_type(shape, bm.array_aval.dtype, space),
                                 space, bm.array_aval.dtype, len(shape)))
            scratch = [(tpx.types.memref_type(t.shape, t.dtype, t.memory_space), t)
                       for t in gm.scratch_types]
            ng = len(gm.grid)
            arg_types = ([tpx.types.i32()] * ng + [o[0] for o in operands]
                         + [s[0] for s in scratch])
            main = func.FuncOp("main", (arg_types, []))
            with ir.InsertionPoint(main.add_entry_block()):
                args = list(main.arguments)
                refs = [tpx.RefVal(a, dt, space, (False,) * rank)
                        for a, (_t, space, dt, rank) in zip(args[ng:], operands)]
                refs += [tpx.RefVal(a, t.dtype, t.memory_space, (False,) * len(t.shape))
                         for a, (_t, t) in zip(args[ng + len(operands):], scratch)]
                lctx = tpx.LoweringContext(tuple(gm.grid), args[:ng], name,
                                           grid_names=tuple(gm.grid_names or ()),
                                           rules=RULES, backend=BACKEND)
                tpx.lower_jaxpr(lctx, jaxpr.jaxpr, jaxpr.consts, refs)
                func.ReturnOp([])
            sem = ["core_parallel", "subcore_parallel"][:ng]
            main.attributes["dimension_semantics"] = ir.ArrayAttr.get(
                [ir.Attribute.parse(f"#tpu.dimension_semantics<{s}>") for s in sem])
            main.attributes["iteration_bounds"] = ir.DenseI64ArrayAttr.get(list(gm.grid))
            main.attributes["scalar_prefetch"] = tpx.types.i64_attr(0)
            main.attributes["scratch_operands"] = tpx.types.i64_attr(len(scratch))
            main.attributes["tpu.core_type"] = ir.Attribute.parse(
                f"#tpu.core_type<{core_type.value}>")
            windows = []
            for _t, _space, _dt, rank in operands:
                amap = ir.AffineMap.get(ng, 0, [ir.AffineConstantExpr.get(0)] * rank)
                windows.append(ir.DictAttr.get(
                    {"transform_indices": ir.AffineMapAttr.get(amap)}))
            main.attributes["window_params"] = ir.ArrayAttr.get(windows)
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            raise tpx.LoweringException(
                f"pallas-tpu-sparsecore produced a Mosaic module for {name} that does not "
                f"verify (a bug in pallas-tpu-sparsecore; please report it): {e}") from e
    return SparseCoreKernel(module, ctx, core_type, frozenset(lctx.uses))


def _tiling(params):
    """SparseCore tiling unless ``use_tc_tiling_on_sc`` asks for TensorCore tiling."""
    if params.use_tc_tiling_on_sc is False:
        return jc.SPARSE_CORE_TILING
    return jc.COMPACT_TILING


def _build(jaxpr, gm, name: str, info: SparseCoreInfo, params) -> SparseCoreKernel:
    """:func:`build_module` with the rules told the kernel's memref tiling."""
    token = _rules.TC_TILING.set(_tiling(params) is jc.COMPACT_TILING)
    try:
        return build_module(jaxpr, gm, name, info)
    finally:
        _rules.TC_TILING.reset(token)


def custom_call_kwargs(params, cost_estimate) -> dict:
    """pallas-tpu's custom-call options for ``params`` (operands in their default memory
    spaces), with SparseCore's memref tiling."""
    return {**tpx.custom_call_options(params, cost_estimate), "tiling": _tiling(params)}


def lower_to_custom_call(ctx, *in_nodes, jaxpr, grid_mapping, params, info, cost_estimate,
                         name, metadata, out_avals):
    kernel = _build(jaxpr, grid_mapping, name, info, params)
    return jc.lower_module_to_custom_call(
        ctx, *in_nodes, module=kernel.module, out_type=tuple(out_avals),
        kernel_name=name.split(" ")[0],
        input_output_aliases=tuple(grid_mapping.input_output_aliases),
        has_side_effects=tpx.side_effect_type(params.has_side_effects),
        metadata=dict(metadata) if metadata else None,
        **custom_call_kwargs(params, cost_estimate),
    )


def backend_config(jaxpr, grid_mapping, params, info, cost_estimate, name: str) -> bytes:
    """The ``tpu_custom_call`` backend config :func:`lower_to_custom_call` attaches."""
    kernel = _build(jaxpr, grid_mapping, name, info, params)
    kw = custom_call_kwargs(params, cost_estimate)
    return jc.backend_config_of(kernel.module, **kw).to_json()
