"""The kernel driver: a ``pallas_call``'s kernel jaxpr plus its GridMapping -> one
``@triton.jit`` function's source (:class:`LoweredKernel`).

Operands are pointer arguments (scalar prefetch, inputs, outputs, in that order); the
block an operand's BlockSpec selects is addressed with pointer arithmetic whose start
comes from the BlockSpec's index map, itself lowered into the kernel with the same
rules. Scratch buffers live in registers. :mod:`..compile` hands the source to
``triton.compile`` and :mod:`..emulate` to Triton's interpreter.
"""

from __future__ import annotations

import dataclasses
import keyword
import re

import numpy as np

from pallas import plugins
from pallas_triton._src.codegen import (
    ArrayDim,
    Emitter,
    GlobalRef,
    Value,
    sig_dtype,
    unsupported,
)
from pallas_triton._src.lowering import grid as grid_lib
from pallas_triton._src.lowering.engine import (
    LoweringContext,
    alloc_local,
    const_value,
    jaxpr_and_consts,
    lower_jaxpr,
)


@dataclasses.dataclass(frozen=True)
class LoweredKernel:
    """A kernel as ``triton.language`` source, plus what is needed to compile or run it."""

    name: str  # the @triton.jit function's name in ``source``
    source: str
    params: tuple[str, ...]  # pointer parameters: scalar prefetch, inputs, outputs
    signature: dict  # parameter -> Triton type string ("*fp32")
    operand_avals: tuple  # ShapedArrays of the parameters, in order
    num_prefetch: int
    num_inputs: int
    num_outputs: int
    launch_grid: tuple[int, int, int]
    grid: tuple[int, ...]
    num_warps: int
    num_stages: int
    input_output_aliases: tuple
    target: str | None = None  # None: NVIDIA; else the AMD architecture it was made for
    externs: tuple[str, ...] = ()  # module-level device library calls (``ocml_cbrt``)

    def __str__(self) -> str:
        return self.source


# Names the generated module binds itself: a kernel called so would shadow them.
_MODULE_NAMES = frozenset({"triton", "tl", "libdevice", "ocml_cbrt"})


def kernel_name(name: str | None) -> str:
    """The kernel's name as a Python identifier for the generated ``def`` (a lambda's
    ``<lambda>`` is ``lambda``, a keyword: it becomes ``lambda_kernel``)."""
    base = (name or "kernel").split(" at ")[0]
    base = re.sub(r"\W+", "_", base).strip("_") or "kernel"
    if base[0].isdigit():
        base = "k_" + base
    if keyword.iskeyword(base) or base in _MODULE_NAMES:
        base += "_kernel"
    return base


def _strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= int(n)
    return tuple(reversed(out))


def _block_ref(ctx: LoweringContext, bm, ptr: str, prefetch_refs) -> GlobalRef:
    shape = tuple(bm.array_aval.shape)
    dtype = bm.array_aval.dtype
    if bm.whole:
        dims = [ArrayDim("0", int(n), int(n)) for n in shape]
        return GlobalRef(ptr, dtype, _strides(shape), dims, bm.origin)
    closed = bm.index_map_jaxpr
    consts = [const_value(c) for c in closed.consts]
    outs = lower_jaxpr(ctx, closed.jaxpr, consts, [*ctx.pids, *prefetch_refs])
    it = iter(outs)
    dims = []
    for d, n in zip(bm.block_dims, shape):
        idx = next(it)
        n = int(n)
        if isinstance(d, plugins.Squeezed):
            dims.append(ArrayDim(_scalar_expr(idx), 1, n, squeezed=True))
        elif isinstance(d, plugins.Blocked):
            start = _scalar_expr(idx)
            start = "0" if start == "0" else f"({start} * {d.block_size})"
            dims.append(ArrayDim(start, d.block_size, n, mask_hi=n % d.block_size != 0))
        elif isinstance(d, plugins.Element):
            lo, hi = d.padding
            start = _scalar_expr(idx)
            if lo:
                start = f"({start} - {lo})"
            dims.append(ArrayDim(start, d.block_size, n, mask_lo=lo > 0,
                                 mask_hi=hi > 0 or n % d.block_size != 0))
        elif isinstance(d, plugins.BoundedSlice):
            size = next(it)
            dims.append(ArrayDim(_scalar_expr(idx), d.block_size, n, mask_hi=True,
                                 bound=_scalar_expr(size)))
        else:
            raise unsupported(f"the block dimension {d} of {bm.origin}")
    # The block's own shape need not be a power of two: only what the kernel reads or
    # writes at once becomes a Triton tensor (checked in refs._address).
    return GlobalRef(ptr, dtype, _strides(shape), dims, bm.origin)


def _scalar_expr(v: Value) -> str:
    return v.expr


def _cache_key(jaxpr, grid_mapping, num_warps, num_stages, name, target):
    # The jaxpr and grid mapping themselves (both compare and hash by identity): a key
    # holds them, so it can never stand for a later object that reuses a dead one's id.
    return (jaxpr, grid_mapping, num_warps, num_stages, name, target)


_CACHE: dict = {}  # cleared when it grows past 256 kernels


def lower_kernel(jaxpr, grid_mapping, compiler_params=None, name: str | None = None,
                 target: str | None = None) -> LoweredKernel:
    """Lowers a ``pallas_call``'s kernel jaxpr (a ClosedJaxpr) to Triton source.

    ``target``: None for NVIDIA GPUs, else an AMD architecture (``"gfx942"``); the
    source differs only where a target lacks something (TF32 dots, PTX inline asm).
    """
    num_warps = getattr(compiler_params, "num_warps", None) or 4
    # Triton's own defaults: 3 stages on NVIDIA, 2 on AMD (LDS is 64 KiB on most AMD
    # GPUs; a third stage of a matmul's operand tiles often does not fit).
    num_stages = getattr(compiler_params, "num_stages", None) or (2 if target else 3)
    key = _cache_key(jaxpr, grid_mapping, num_warps, num_stages, name, target)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    lowered = _lower_kernel(jaxpr, grid_mapping, num_warps, num_stages, name, target)
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[key] = lowered
    return lowered


def _lower_kernel(jaxpr, gm, num_warps, num_stages, name, target) -> LoweredKernel:
    fname = kernel_name(name)
    em = Emitter()
    grid = tuple(int(g) for g in gm.grid)
    ctx = LoweringContext(em, grid, fname, target)
    seq_axes = grid_lib.sequential_axes(gm)
    par_axes = [a for a in range(len(grid)) if a not in seq_axes]
    par_grid = tuple(grid[a] for a in par_axes)
    launch, collapsed = grid_lib.launch_grid(par_grid)
    grid_lib.emit_program_ids(ctx, par_grid, collapsed)
    pids = dict(zip(par_axes, ctx.pids))

    params, sig, avals = [], {}, []
    prefetch_refs = []
    for i, aval in enumerate(gm.prefetch_avals):
        p = f"prefetch{i}_ptr"
        params.append(p)
        sig[p] = "*" + sig_dtype(aval.dtype)
        avals.append(aval)
        shape = tuple(aval.shape)
        dims = [ArrayDim("0", int(n), int(n)) for n in shape]
        prefetch_refs.append(GlobalRef(p, aval.dtype, _strides(shape), dims,
                                       f"scalar prefetch operand {i}"))
    scratch_refs = []
    for i, t in enumerate(gm.scratch_types):
        scratch_refs.append(alloc_local(em, t, f"scratch operand {i}", f"scratch{i}"))
    # Reduction axes (see ``sequential_axes``) become loops around the whole body, so
    # that revisited output blocks and scratch carry over between their iterations.
    for a in seq_axes:
        it = em.fresh(f"step{a}_")
        em.line(f"for {it} in range(0, {grid[a]}):")
        em.depth += 1
        pids[a] = Value(it, (), np.int32)
    ctx.pids = [pids[a] for a in range(len(grid))]
    operand_refs = []
    for j, bm in enumerate(gm.block_mappings):
        kind = "in" if j < gm.num_inputs else "out"
        k = j if j < gm.num_inputs else j - gm.num_inputs
        p = f"{kind}{k}_ptr"
        params.append(p)
        sig[p] = "*" + sig_dtype(bm.array_aval.dtype)
        avals.append(bm.array_aval)
        ref = _block_ref(ctx, bm, p, prefetch_refs)
        if kind == "out" and not bm.whole:
            used = grid_lib.depends(bm.index_map_jaxpr.jaxpr, len(grid))
            ref.shared_along = tuple(a for a in par_axes if a not in used and grid[a] > 1)
        operand_refs.append(ref)

    grid_lib.check_scratch_carry(jaxpr, gm, seq_axes, par_grid)
    closed = jaxpr
    consts = [const_value(c) for c in closed.consts]
    refs = [*prefetch_refs, *operand_refs, *scratch_refs]
    body, last = closed.jaxpr, None
    if len(seq_axes) == 1:
        # Input blocks may move along the loop axis: only outputs, scratch and scalar
        # prefetch (addressed the same at every step) may be used after the loop.
        inputs = body.invars[len(prefetch_refs):len(prefetch_refs) + gm.num_inputs]
        last = grid_lib.final_step_epilogue(body, seq_axes[0], grid, set(body.invars) - set(inputs))
    if last is None:
        lower_jaxpr(ctx, body, consts, refs)
    else:
        # ``pl.when(k == last)`` ending the body of the K loop: emitted after the loop,
        # where it runs at the same point (after the last step's body). Inside the loop
        # its store keeps a layout conversion of the accumulator live next to the
        # pipelined buffers (more shared memory, and spills); after it, none.
        lower_jaxpr(ctx, body.replace(eqns=body.eqns[:-1]), consts, refs)
        em.depth -= 1
        a = seq_axes[0]
        ctx.pids[a] = Value(str(grid[a] - 1), (), np.int32, literal=True)
        env = dict(zip(body.invars, refs))
        jaxpr1, consts1 = jaxpr_and_consts(last.params["branches"][1])
        lower_jaxpr(ctx, jaxpr1, consts1, [env[v] for v in last.invars[1:]])

    header = [
        "import triton",
        "import triton.language as tl",
        "from triton.language.extra import libdevice",
        "",
    ]
    for extern in em.externs.values():
        header += ["", *extern.rstrip("\n").split("\n"), ""]
    for helper in em.helpers.values():
        header += ["", "@triton.jit", *helper.rstrip("\n").split("\n"), ""]
    header += [
        "",
        "@triton.jit",
        f"def {fname}({', '.join(params)}):",
    ]
    body = em.lines or ["    pass"]
    source = "\n".join(header + body) + "\n"
    return LoweredKernel(
        name=fname, source=source, params=tuple(params), signature=sig,
        operand_avals=tuple(avals), num_prefetch=len(prefetch_refs),
        num_inputs=gm.num_inputs, num_outputs=gm.num_outputs, launch_grid=launch,
        grid=grid, num_warps=int(num_warps), num_stages=int(num_stages),
        input_output_aliases=tuple(gm.input_output_aliases), target=target,
        externs=tuple(em.externs),
    )


def describe(lowered: LoweredKernel) -> str:
    """A short, human-readable header for the generated source."""
    return (f"# Pallas Triton kernel {lowered.name}: grid {lowered.grid} -> launch grid "
            f"{lowered.launch_grid}, num_warps={lowered.num_warps}, "
            f"num_stages={lowered.num_stages}\n")
