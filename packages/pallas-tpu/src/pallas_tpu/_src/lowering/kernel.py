"""Builds the Mosaic TPU module of a ``pallas_call``: the kernel ``func.func @main`` with
its grid and window parameters, and one ``transform_<k>`` function per blocked operand.

A dynamic grid size (``dynamic_grid_dim``) is MLIR's dynamic size in
``iteration_bounds``; the custom call receives it as an i32 operand before all others.

``@main`` takes, in order: one i32 per grid dimension (the program ids), the
scalar-prefetch operands (whole, in SMEM), one memref per input and output (the block
window in VMEM/SMEM, or the whole array for ``ANY``/``HBM`` operands), and the scratch
buffers. Its attributes tell Mosaic how to pipeline the grid: ``iteration_bounds``,
``dimension_semantics``, ``window_params`` (block shape + index transform per operand),
``scalar_prefetch``, ``scratch_operands`` and ``tpu.core_type``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, func
from jaxlib.mosaic.python import tpu

import pallas as pl
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.compiler_params import ARBITRARY, CORE_PARALLEL, CompilerParams
from pallas_tpu._src.core_compat import dynamic_grid_dim
from pallas_tpu._src.enums import LoweringException
from pallas_tpu._src.lowering import rules as _rules  # noqa: F401 - registers every rule
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import materialize, to_i32
from pallas_tpu._src.lowering.dma_semaphores import dma_semaphore_operands
from pallas_tpu._src.lowering.engine import lower_jaxpr
from pallas_tpu._src.lowering.symbolic import Placeholders, placeholders, static_shape
from pallas_tpu._src.lowering.values import Lit, LoweringContext, RefVal
from pallas_tpu._src.memory import MemorySpace, SemaphoreType, is_any_space
from pallas_tpu._src.vmem import target_chip


@dataclasses.dataclass
class MosaicKernel:
    """The lowered kernel: the module, its context, and what the custom call needs."""

    module: ir.Module
    context: ir.Context
    input_memory_spaces: tuple
    output_memory_spaces: tuple
    primitives: frozenset
    placeholders: Placeholders | None = None  # of symbolic dimensions (jax.export)


def new_context() -> ir.Context:
    ctx = jc.make_ir_context()
    tpu.register_dialect(ctx)
    return ctx


def _block_memref(bm, dma_semaphore: bool = False):
    """(memref type, squeezed mask, space) of a block operand as the kernel receives it;
    ``dma_semaphore``: the kernel uses this semaphore operand for DMAs."""
    space = T.space_of(bm.memory_space)
    if dma_semaphore and T.is_semaphore(space):
        space = SemaphoreType.DMA
    if is_any_space(bm.memory_space) or space is MemorySpace.HOST:
        shape = tuple(bm.array_aval.shape)
        return T.memref_type(shape, bm.array_aval.dtype, space), (False,) * len(shape), space
    shape = tuple(bm.block_shape)
    squeezed = tuple(isinstance(d, pl.Squeezed) for d in bm.block_dims)
    if (not shape and bm.memory_space is None
            and T.memory_dtype(bm.array_aval.dtype).itemsize == 4):
        # A 0-d operand has no (8, 128) tile to live in: unless placed explicitly, a
        # 32-bit scalar goes to SMEM (read and written with memref.load/store).
        space = MemorySpace.SMEM
    return T.memref_type(shape, bm.array_aval.dtype, space), squeezed, space


def uses_element_window(bm) -> bool:
    """Whether the operand's window is given in element offsets (``#tpu.element_window``):
    true when some block dim is ``Element`` or ``BoundedSlice``."""
    return any(isinstance(d, (pl.Element, pl.BoundedSlice)) for d in bm.block_dims)


def _element_offsets(bm, outs, name):
    """The element offset of every block dim from the index map's outputs.

    In an element window Mosaic reads every transform result as an element offset, so a
    ``Blocked(b)`` dim's block index ``i`` becomes ``i * b``; ``Element`` and
    ``Squeezed`` dims already are offsets. A ``BoundedSlice(b)`` dim yields
    ``(start, size)``; it lowers when ``size`` is statically ``b`` (then it is an
    element window of ``b`` rows at ``start``).
    """
    offsets, k = [], 0
    for i, d in enumerate(bm.block_dims):
        o = outs[k]
        if isinstance(d, pl.BoundedSlice):
            size = outs[k + 1]
            k += 2
            if not (isinstance(size, Lit) and int(np.asarray(size.val)) == d.block_size):
                raise LoweringException(
                    f"pallas-tpu (backend 'mosaic_tpu') lowers a BoundedSlice block dim "
                    f"only when the index map's pl.ds size is the static block size: "
                    f"operand {bm.origin} of {name}, dim {i} is {d} but its size is "
                    f"{'dynamic' if not isinstance(size, Lit) else int(np.asarray(size.val))}"
                    f". Dynamic sizes run under interpret=True."
                )
            offsets.append(to_i32(o))
            continue
        k += 1
        scale = d.block_size if isinstance(d, pl.Blocked) else 1
        if isinstance(o, Lit):
            offsets.append(arith.constant(T.i32(), int(np.asarray(o.val)) * scale))
        elif scale != 1:
            offsets.append(arith.muli(to_i32(o), arith.constant(T.i32(), scale)))
        else:
            offsets.append(to_i32(o))
    return offsets


def _element_window_attr(bm) -> ir.Attribute:
    pads = [d.padding if isinstance(d, pl.Element) else (0, 0) for d in bm.block_dims]
    low = ", ".join(str(int(lo)) for lo, _ in pads)
    high = ", ".join(str(int(hi)) for _, hi in pads)
    return ir.Attribute.parse(f"#tpu.element_window<[{low}], [{high}]>")


def _emit_transform(k, bm, gm, grid, prefetch_types, name, mesh_axes) -> str:
    fname = f"transform_{k}"
    grid_types = [T.i32()] * len(grid)
    n_out = len(bm.block_dims)
    f = func.FuncOp(fname, (grid_types + prefetch_types, [T.i32()] * n_out))
    with ir.InsertionPoint(f.add_entry_block()):
        args = list(f.arguments)
        grid_args = args[: len(gm.grid)]  # the (1,) stand-in grid's index is unused
        pf = [RefVal(a, av.dtype, MemorySpace.SMEM, (False,) * len(av.shape))
              for a, av in zip(args[len(grid):], gm.prefetch_avals)]
        lctx = LoweringContext(gm.grid, [], f"index_map of {bm.origin} in {name}",
                               mesh_axes=mesh_axes)
        cj = bm.index_map_jaxpr
        outs = lower_jaxpr(lctx, cj.jaxpr, cj.consts, [*grid_args, *pf])
        if uses_element_window(bm):
            vals = _element_offsets(bm, outs, name)
        else:
            vals = [to_i32(materialize(o, v.aval)) for o, v in zip(outs, cj.jaxpr.outvars)]
        func.ReturnOp(vals)
    return fname


def has_trivial_window(bm) -> bool:
    """Whether the block is the whole operand (so a grid-less kernel needs no window)."""
    return (all(isinstance(d, (pl.Blocked, pl.Squeezed)) for d in bm.block_dims)
            and tuple(bm.block_shape) == tuple(bm.array_aval.shape))


def _pipeline_params(bm, space, name: str) -> dict:
    """``window_params``' ``pipeline_mode`` (and ``revisit_mode``) of a block: what
    ``pipeline_mode=pl.Buffered(n)`` asks of the compiler's pipeline (1: synchronous, one
    VMEM buffer; 2: double-buffered). A VMEM block that is its whole operand at index 0
    on every step is loaded once, so it is single-buffered too."""
    mode = bm.pipeline_mode
    if (mode is None and space is MemorySpace.VMEM and has_trivial_window(bm)
            and all(isinstance(v, jc.Literal) and v.val == 0
                    for v in bm.index_map_jaxpr.jaxpr.outvars)):
        mode = pl.Buffered(1)
    if mode is None:
        return {}
    where = f"pallas_call {name}: {bm.origin}: pipeline_mode={mode!r}"
    if not isinstance(mode, pl.Buffered):
        raise LoweringException(f"{where}: Mosaic TPU takes a pl.Buffered pipeline mode")
    if mode.use_lookahead:
        raise NotImplementedError(f"{where}: lookahead is not supported by Mosaic TPU's "
                                  f"grid pipeline (pltpu.emit_pipeline supports it)")
    if mode.buffer_count > 2:
        raise LoweringException(f"{where}: Mosaic TPU's grid pipeline keeps 1 (synchronous) "
                                f"or 2 (double-buffered) buffers per operand")
    kind = "synchronous" if mode.buffer_count == 1 else "double_buffered"
    out = {"pipeline_mode": ir.Attribute.parse(f"#tpu.pipeline_mode<{kind}>")}
    if mode.revisit is not None:
        if mode.revisit is pl.RevisitMode.ANY and mode.buffer_count > 1:
            raise LoweringException(f"{where}: RevisitMode.ANY needs a single buffer "
                                    f"(pl.Buffered(1, revisit=...))")
        out["revisit_mode"] = ir.Attribute.parse(f"#tpu.revisit_mode<{mode.revisit.value}>")
    return out


def mosaic_grid(gm) -> tuple:
    """The grid Mosaic is given. A kernel without a grid whose blocks are all whole
    operands has none: Mosaic then takes no ``iteration_bounds`` or ``window_params``
    (it rejects window attributes without iteration bounds). One with a partial block
    (or an element window) runs on the one-step grid ``(1,)``."""
    if gm.grid or all(has_trivial_window(bm) or is_any_space(bm.memory_space)
                      or T.space_of(bm.memory_space) is MemorySpace.HOST
                      for bm in gm.block_mappings):
        return tuple(gm.grid)
    return (1,)


def _semantics_attr(params: CompilerParams, gm, grid) -> ir.ArrayAttr:
    rank = len(grid)
    default = CORE_PARALLEL if gm.grid_names else ARBITRARY  # pl.kernel over cores
    sem = (params.dimension_semantics if len(grid) == len(gm.grid) else None) \
        or (default,) * rank
    return ir.ArrayAttr.get(
        [ir.Attribute.parse(f"#tpu.dimension_semantics<{s.value}>") for s in sem])


def build_module(jaxpr, gm, params: CompilerParams, name: str,
                 mesh_axes: tuple = (), ir_version: int | None = None) -> MosaicKernel:
    """Lowers the kernel jaxpr and grid mapping to a verified Mosaic TPU module; symbolic
    dimensions (dynamic-shape export) become placeholders (see ``symbolic``).
    ``ir_version``: the Mosaic serialization version the module will be written in
    (None: the latest); what older versions cannot carry (``tpu.matmul``'s
    ``transpose_lhs_hint`` before version 12) is left out."""
    ctx = new_context()
    with ctx, ir.Location.unknown(), placeholders(True) as env:
        module = ir.Module.create()
        grid = mosaic_grid(gm)
        with ir.InsertionPoint(module.body):
            prefetch_types = [T.memref_type(a.shape, a.dtype, MemorySpace.SMEM)
                              for a in gm.prefetch_avals]
            window_params, block_args = [], []
            dma_sems = dma_semaphore_operands(jaxpr.jaxpr)
            npf = len(prefetch_types)
            for k, bm in enumerate(gm.block_mappings):
                mt, squeezed, space = _block_memref(bm, npf + k in dma_sems)
                block_args.append((mt, squeezed, space, bm))
                if is_any_space(bm.memory_space) or space is MemorySpace.HOST:
                    window_params.append(ir.DictAttr.get({}))
                    continue
                if not grid:
                    continue
                tname = _emit_transform(k, bm, gm, grid, prefetch_types, name, mesh_axes)
                wp = {
                    "transform_indices": ir.FlatSymbolRefAttr.get(tname),
                    "window_bounds": ir.DenseI64ArrayAttr.get(static_shape(bm.block_shape)),
                }
                if uses_element_window(bm):
                    wp["window_kind"] = _element_window_attr(bm)
                wp.update(_pipeline_params(bm, space, name))
                window_params.append(ir.DictAttr.get(wp))
            scratch = []
            for t in gm.scratch_types:
                space = T.scratch_space(t.memory_space)
                scratch.append((T.memref_type(t.shape, t.dtype, space), t, space))
            arg_types = ([T.i32()] * len(grid) + prefetch_types
                         + [b[0] for b in block_args] + [s[0] for s in scratch])
            main = func.FuncOp("main", (arg_types, []))
            with ir.InsertionPoint(main.add_entry_block()):
                args = list(main.arguments)
                ng, npf = len(grid), len(prefetch_types)
                grid_idx = args[:len(gm.grid)]
                refs = [RefVal(a, av.dtype, MemorySpace.SMEM, (False,) * len(av.shape))
                        for a, av in zip(args[ng:ng + npf], gm.prefetch_avals)]
                for a, (_mt, squeezed, space, bm) in zip(args[ng + npf:], block_args):
                    refs.append(RefVal(a, bm.array_aval.dtype, space, squeezed))
                for a, (_mt, t, space) in zip(args[ng + npf + len(block_args):], scratch):
                    refs.append(RefVal(a, t.dtype, space, (False,) * len(t.shape)))
                lctx = LoweringContext(gm.grid, grid_idx, name, mesh_axes=mesh_axes,
                                       grid_names=tuple(gm.grid_names or ()),
                                       chip=target_chip(params),
                                       fuse_transposed_lhs=params.fuse_transposed_lhs_in_matmul
                                       and (ir_version is None or ir_version >= 12))
                lower_jaxpr(lctx, jaxpr.jaxpr, jaxpr.consts, refs)
                func.ReturnOp([])
            main.attributes["dimension_semantics"] = _semantics_attr(params, gm, grid)
            if grid:
                # A dynamic grid size is MLIR's dynamic size here; its value is an operand
                # of the custom call (before all others) and tpu.iteration_bound reads it.
                main.attributes["iteration_bounds"] = ir.DenseI64ArrayAttr.get(
                    [ir.ShapedType.get_dynamic_size() if g is dynamic_grid_dim else g
                     for g in grid])
                main.attributes["window_params"] = ir.ArrayAttr.get(window_params)
            main.attributes["scalar_prefetch"] = T.i64_attr(gm.num_scalar_prefetch)
            main.attributes["scratch_operands"] = T.i64_attr(len(gm.scratch_types))
            main.attributes["tpu.core_type"] = ir.Attribute.parse("#tpu.core_type<tc>")
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            raise LoweringException(
                f"pallas-tpu produced a Mosaic module for {name} that does not verify "
                f"(a bug in pallas-tpu; please report it): {e}"
            ) from e
    spaces = [_custom_call_space(b[2]) for b in block_args]
    nin = gm.num_inputs
    # An input's space is a constraint XLA can only place in HBM, VMEM or SMEM: a semaphore
    # input is whatever semaphore memory the kernel that produced it placed it in.
    in_spaces = tuple([jc.CustomCallMemorySpace.SMEM] * gm.num_scalar_prefetch
                      + [None if s is jc.CustomCallMemorySpace.SEMAPHORE_MEM else s
                         for s in spaces[:nin]])
    return MosaicKernel(module, ctx, in_spaces, tuple(spaces[nin:]), frozenset(lctx.uses),
                        env)


def _custom_call_space(space):
    if space in (MemorySpace.ANY, MemorySpace.HBM):
        return None
    if space is MemorySpace.SMEM:
        return jc.CustomCallMemorySpace.SMEM
    if space is MemorySpace.HOST:
        return jc.CustomCallMemorySpace.HOST
    if T.is_semaphore(space):
        # A semaphore crossing the call lives in semaphore memory: XLA must not place it
        # in HBM, where Mosaic cannot give it a window (libtpu: "Operand windows can only
        # be requested in VMEM, SMEM, or HOST").
        return jc.CustomCallMemorySpace.SEMAPHORE_MEM
    return None
