"""Lowering: a Pallas kernel jaxpr plus its GridMapping -> ``triton.language`` source.

Each Pallas grid point is one Triton program. Operands are pointer arguments (scalar
prefetch, inputs, outputs, in that order); the block an operand's BlockSpec selects is
addressed with pointer arithmetic whose start comes from the BlockSpec's index map,
itself lowered into the kernel with the same rules. Scratch buffers live in registers.

The result, :class:`LoweredKernel`, holds the source text; :mod:`.compile` hands it to
``triton.compile`` and :mod:`.emulate` to Triton's interpreter.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from pallas import plugins
from pallas_triton._src import refs
from pallas_triton._src.codegen import (
    ArrayDim,
    Emitter,
    GlobalRef,
    LocalRef,
    TritonLoweringError,
    Value,
    check_pow2,
    dtype_name,
    py_scalar,
    sig_dtype,
    tl_dtype,
    typed,
    unsupported,
)
from pallas_triton._src.ops import RULES

MAX_GRID_AXES = 3
_MAX_YZ = 65535

# Alternatives named in "unsupported primitive" errors.
_ALTERNATIVES = {
    "gather": "index with pl.ds or load whole blocks",
    "scatter": "write with pl.ds or masked pl.store",
    "scatter-add": "use pallas.atomics.atomic_add (pltriton.atomic_add)",
    "sort": "sort outside the kernel",
    "concatenate": "write the pieces into an output ref with pl.ds",
    "pad": "use a larger BlockSpec; edge blocks are masked",
    "dynamic_slice": "load the slice from a ref with pl.ds",
    "dynamic_update_slice": "store into a ref with pl.ds",
    "semaphore_signal": "semaphores need the Mosaic backends (pallas-tpu, pallas-mosaic-gpu)",
    "semaphore_wait": "semaphores need the Mosaic backends (pallas-tpu, pallas-mosaic-gpu)",
    "semaphore_read": "semaphores need the Mosaic backends (pallas-tpu, pallas-mosaic-gpu)",
    "reduce_and": "compare with jnp.min on an integer cast",
    "reduce_or": "compare with jnp.max on an integer cast",
    "reduce_prod": "use jnp.exp(jnp.sum(jnp.log(x))) or a loop",
    "cumprod": "use a fori_loop over the axis, or jnp.cumsum of logarithms",
    "cummax": "use a fori_loop over the axis",
    "cummin": "use a fori_loop over the axis",
}


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

    def __str__(self) -> str:
        return self.source


class LoweringContext:
    def __init__(self, em: Emitter, grid: tuple[int, ...]):
        self.em = em
        self.grid = grid
        self.pids: list[Value] = []


# -- the driver --------------------------------------------------------------------------


def kernel_name(name: str | None) -> str:
    base = (name or "kernel").split(" at ")[0]
    base = re.sub(r"\W+", "_", base).strip("_") or "kernel"
    if base[0].isdigit():
        base = "k_" + base
    return base


def _strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= int(n)
    return tuple(reversed(out))


def _launch_grid(grid) -> tuple[tuple[int, int, int], bool]:
    """The Triton launch grid, and whether the Pallas grid was collapsed into axis 0."""
    if not grid:
        return (1, 1, 1), False
    if len(grid) <= MAX_GRID_AXES and all(g <= _MAX_YZ for g in grid[1:]):
        return tuple(grid) + (1,) * (MAX_GRID_AXES - len(grid)), False
    return (math.prod(grid), 1, 1), True


def _emit_program_ids(ctx: LoweringContext, grid, collapsed: bool) -> None:
    em = ctx.em
    if not collapsed:
        for i in range(len(grid)):
            ctx.pids.append(em.assign(f"tl.program_id({i})", (), np.int32, prefix="pid"))
        return
    flat = em.assign("tl.program_id(0)", (), np.int32, prefix="pid_flat")
    rest = flat.expr
    pids = []
    for g in reversed(grid):
        pids.append(em.assign(f"{rest} % {g}", (), np.int32, prefix="pid"))
        rest_v = em.assign(f"{rest} // {g}", (), np.int32, prefix="pid_rest")
        rest = rest_v.expr
    ctx.pids.extend(reversed(pids))


def _block_ref(ctx: LoweringContext, bm, ptr: str, prefetch_refs) -> GlobalRef:
    shape = tuple(bm.array_aval.shape)
    dtype = bm.array_aval.dtype
    if bm.whole:
        dims = [ArrayDim("0", int(n), int(n)) for n in shape]
        return GlobalRef(ptr, dtype, _strides(shape), dims, bm.origin)
    closed = bm.index_map_jaxpr
    consts = [_const_value(c) for c in closed.consts]
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


def _const_value(c) -> Value:
    arr = np.asarray(c)
    if arr.shape != ():
        raise unsupported(
            f"a captured array constant of shape {arr.shape}",
            "pass the array to pallas_call as an input, or build it with jnp.arange/jnp.full",
        )
    return Value(py_scalar(arr, arr.dtype), (), arr.dtype, literal=True)


def _cache_key(jaxpr, grid_mapping, num_warps, num_stages, name):
    return (id(jaxpr), id(grid_mapping), num_warps, num_stages, name)


_CACHE: dict = {}


def lower_kernel(jaxpr, grid_mapping, compiler_params=None, name: str | None = None
                 ) -> LoweredKernel:
    """Lowers a ``pallas_call``'s kernel jaxpr (a ClosedJaxpr) to Triton source."""
    num_warps = getattr(compiler_params, "num_warps", None) or 4
    num_stages = getattr(compiler_params, "num_stages", None) or 3
    key = _cache_key(jaxpr, grid_mapping, num_warps, num_stages, name)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is jaxpr and hit[1] is grid_mapping:
        return hit[2]
    lowered = _lower_kernel(jaxpr, grid_mapping, num_warps, num_stages, name)
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[key] = (jaxpr, grid_mapping, lowered)
    return lowered


def _lower_kernel(jaxpr, gm, num_warps, num_stages, name) -> LoweredKernel:
    fname = kernel_name(name)
    em = Emitter()
    grid = tuple(int(g) for g in gm.grid)
    ctx = LoweringContext(em, grid)
    seq_axes = sequential_axes(gm)
    par_axes = [a for a in range(len(grid)) if a not in seq_axes]
    par_grid = tuple(grid[a] for a in par_axes)
    launch, collapsed = _launch_grid(par_grid)
    _emit_program_ids(ctx, par_grid, collapsed)
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
        scratch_refs.append(_alloc_local(em, t, f"scratch operand {i}", f"scratch{i}"))
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
            used = _depends(bm.index_map_jaxpr.jaxpr, len(grid))
            ref.shared_along = tuple(a for a in par_axes if a not in used and grid[a] > 1)
        operand_refs.append(ref)

    _check_scratch_carry(jaxpr, gm, seq_axes, par_grid)
    closed = jaxpr
    consts = [_const_value(c) for c in closed.consts]
    refs = [*prefetch_refs, *operand_refs, *scratch_refs]
    body, last = closed.jaxpr, None
    if len(seq_axes) == 1:
        # Input blocks may move along the loop axis: only outputs, scratch and scalar
        # prefetch (addressed the same at every step) may be used after the loop.
        inputs = body.invars[len(prefetch_refs):len(prefetch_refs) + gm.num_inputs]
        last = _final_step_epilogue(body, seq_axes[0], grid, set(body.invars) - set(inputs))
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
        jaxpr1, consts1 = _closed(last.params["branches"][1])
        lower_jaxpr(ctx, jaxpr1, consts1, [env[v] for v in last.invars[1:]])

    header = [
        "import triton",
        "import triton.language as tl",
        "from triton.language.extra import libdevice",
        "",
    ]
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
        input_output_aliases=tuple(gm.input_output_aliases),
    )


def _final_step_epilogue(jaxpr, axis: int, grid, allowed: set):
    """The kernel's last equation if it is ``pl.when(program_id(axis) == last)`` over
    ``allowed`` refs only (with an empty else branch); else None."""
    if not jaxpr.eqns:
        return None
    eqn = jaxpr.eqns[-1]
    if eqn.primitive.name != "cond" or eqn.outvars or len(eqn.params["branches"]) != 2:
        return None
    if _closed(eqn.params["branches"][0])[0].eqns:
        return None
    if not all(type(v).__name__ != "Literal" and v in allowed for v in eqn.invars[1:]):
        return None
    producers = {o: e for e in jaxpr.eqns for o in e.outvars}

    def const(v):
        if type(v).__name__ == "Literal":
            return int(v.val) if np.ndim(v.val) == 0 else None
        e = producers.get(v)
        if e is None:
            return None
        if e.primitive.name == "num_programs":
            return int(grid[e.params["axis"]])
        if e.primitive.name in ("sub", "add"):
            x, y = (const(u) for u in e.invars)
            if x is None or y is None:
                return None
            return x - y if e.primitive.name == "sub" else x + y
        return None

    def is_pid(v):
        e = None if type(v).__name__ == "Literal" else producers.get(v)
        return e is not None and e.primitive.name == "program_id" and e.params["axis"] == axis

    idx = eqn.invars[0]
    e = producers.get(idx)
    if e is not None and e.primitive.name == "convert_element_type":
        e = producers.get(e.invars[0])
    if e is None or e.primitive.name != "eq":
        return None
    x, y = e.invars
    if is_pid(x) and const(y) == grid[axis] - 1 or is_pid(y) and const(x) == grid[axis] - 1:
        return eqn
    return None


def _depends(jaxpr, n_axes: int) -> set[int]:
    """The grid axes (leading invars) that some output of ``jaxpr`` depends on."""
    taint = {v: {i} for i, v in enumerate(jaxpr.invars[:n_axes])}
    for eqn in jaxpr.eqns:
        deps = set()
        for v in eqn.invars:
            if type(v).__name__ != "Literal":
                deps |= taint.get(v, set())
        if deps:
            for o in eqn.outvars:
                taint[o] = deps
    out = set()
    for v in jaxpr.outvars:
        if type(v).__name__ != "Literal":
            out |= taint.get(v, set())
    return out


def _check_scratch_carry(jaxpr, gm, seq_axes, par_grid) -> None:
    """Rejects scratch that a program would inherit from the previous one.

    Each Triton program starts with fresh scratch; Pallas carries scratch from one grid
    step to the next. That differs only where a program may read scratch before writing
    it at its first step (loop axes at 0), with more than one program.
    """
    if not gm.scratch_types or math.prod(par_grid) <= 1:
        return
    first = gm.num_scalar_prefetch + gm.num_inputs + gm.num_outputs
    if plugins.scratch_live_in(jaxpr, first, {a: 0 for a in seq_axes}, gm.grid):
        raise unsupported(
            "scratch carried from one program to the next (read before it is written at "
            "the first step of a program, which runs in parallel with the others)",
            "initialise scratch at the first step of each program, e.g. under "
            "pl.when(pl.program_id(k) == 0) for a reduction axis k that no output's index "
            "map uses (such axes run as a loop inside each program), or carry the value "
            "in an output")


def sequential_axes(gm) -> list[int]:
    """Grid axes that run as a loop inside each Triton program rather than in parallel.

    Pallas runs the grid in order, so a blocked output whose index map ignores an axis
    is revisited along it (the accumulator pattern of a tiled matmul's K axis). Such
    axes are looped over inside the program, where revisits and scratch carry over as
    in the interpreter. Outputs passed whole keep every axis parallel: their kernels
    index them by ``program_id`` themselves.
    """
    n = len(gm.grid)
    outs = [bm for bm in gm.out_block_mappings if not bm.whole]
    if not outs or n == 0:
        return []
    used = set()
    for bm in outs:
        used |= _depends(bm.index_map_jaxpr.jaxpr, n)
    return [a for a in range(n) if a not in used and gm.grid[a] > 1]


def _alloc_local(em: Emitter, t, origin: str, prefix: str) -> LocalRef:
    space = getattr(t, "memory_space", None)
    if "semaphore" in str(space).lower() or "Semaphore" in type(space).__name__:
        raise unsupported(f"the semaphore buffer {origin}",
                          "semaphores need the Mosaic backends (pallas-tpu, pallas-mosaic-gpu)")
    shape = tuple(int(n) for n in t.shape)
    check_pow2(shape, origin)
    name = em.fresh(prefix)
    em.line(f"{name} = tl.zeros({list(shape)}, {tl_dtype(t.dtype)})")
    return LocalRef(name, shape, t.dtype, origin)


# -- jaxprs ------------------------------------------------------------------------------


def _read(env, atom):
    if type(atom).__name__ == "Literal":
        aval = atom.aval
        val = np.asarray(atom.val)
        if val.shape != ():
            raise unsupported(f"an array literal of shape {val.shape}")
        return Value(py_scalar(val, aval.dtype), (), aval.dtype, literal=True)
    return env[atom]


def _used_vars(jaxpr) -> set:
    used = set()
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if type(v).__name__ != "Literal":
                used.add(v)
    for v in jaxpr.outvars:
        if type(v).__name__ != "Literal":
            used.add(v)
    return used


def lower_jaxpr(ctx: LoweringContext, jaxpr, consts, args) -> list:
    """Emits ``jaxpr`` (an open Jaxpr) with its constvars and invars bound; returns outs."""
    env: dict = {}
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    if len(args) != len(jaxpr.invars):
        raise TritonLoweringError(
            f"internal: jaxpr takes {len(jaxpr.invars)} arguments, got {len(args)}")
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    used = _used_vars(jaxpr)
    for eqn in jaxpr.eqns:
        invals = [_read(env, a) for a in eqn.invars]
        outs = _lower_eqn(ctx, eqn, invals, used)
        if len(outs) != len(eqn.outvars):
            raise TritonLoweringError(
                f"internal: rule for {eqn.primitive.name} returned {len(outs)} values")
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [_read(env, v) for v in jaxpr.outvars]


def _lower_eqn(ctx, eqn, invals, used):
    name = eqn.primitive.name
    special = _SPECIAL.get(name)
    if special is not None:
        return special(ctx, eqn, invals, used)
    rule = RULES.get(name)
    if rule is None:
        raise unsupported(f"the primitive {name!r}", _ALTERNATIVES.get(name))
    for v in invals:
        if isinstance(v, (GlobalRef, LocalRef)):
            raise unsupported(f"passing a ref to {name!r}")
    return rule(ctx, eqn, *invals)


_SPECIAL: dict = {}


def special(*names):
    def register(fn):
        for n in names:
            _SPECIAL[n] = fn
        return fn

    return register


# -- Pallas primitives -------------------------------------------------------------------


@special("program_id")
def _program_id(ctx, eqn, invals, used):
    axis = int(eqn.params["axis"])
    if not 0 <= axis < len(ctx.pids):
        raise TritonLoweringError(
            f"pl.program_id({axis}) is out of range for the grid {ctx.grid}")
    return [ctx.pids[axis]]


@special("num_programs")
def _num_programs(ctx, eqn, invals, used):
    axis = int(eqn.params["axis"])
    if not 0 <= axis < len(ctx.grid):
        raise TritonLoweringError(
            f"pl.num_programs({axis}) is out of range for the grid {ctx.grid}")
    return [Value(str(ctx.grid[axis]), (), np.int32, literal=True)]


@special("multiple_of")
def _multiple_of(ctx, eqn, invals, used):
    (x,) = invals
    if x.literal or x.shape == ():
        return [x]
    values = list(eqn.params["values"])
    arg = values[0] if len(values) == 1 else values
    return [ctx.em.assign(f"tl.multiple_of({x.expr}, {arg})", x.shape, x.dtype)]


@special("max_contiguous")
def _max_contiguous(ctx, eqn, invals, used):
    (x,) = invals
    if x.literal or x.shape == ():
        return [x]
    values = list(eqn.params["values"])
    arg = values[0] if len(values) == 1 else values
    return [ctx.em.assign(f"tl.max_contiguous({x.expr}, {arg})", x.shape, x.dtype)]


def _split_transforms(eqn, rest):
    tree = eqn.params["tree"]
    n = tree.num_leaves
    return refs.unflatten_transforms(tree, rest[:n]), rest[n:]


@special("get")
def _get(ctx, eqn, invals, used):
    ref, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    return [refs.load(ctx.em, ref, transforms)]


@special("swap")
def _swap(ctx, eqn, invals, used):
    ref, val, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    want = eqn.outvars[0] in used
    old = refs.store(ctx.em, ref, transforms, val, want_old=want)
    return [old if old is not None else val]


@special("addupdate")
def _addupdate(ctx, eqn, invals, used):
    ref, val, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    cur = refs.load(ctx.em, ref, transforms)
    new = ctx.em.assign(f"{cur.expr} + {val.expr}", cur.shape, cur.dtype)
    refs.store(ctx.em, ref, transforms, new, want_old=False)
    return []


def _hints(eqn) -> str:
    parts = []
    cache = eqn.params.get("cache_modifier")
    if cache:
        parts.append(f'cache_modifier="{cache}"')
    evict = eqn.params.get("eviction_policy")
    if evict:
        parts.append(f'eviction_policy="{evict}"')
    if eqn.params.get("is_volatile"):
        parts.append("volatile=True")
    return ", ".join(parts)


@special("masked_load", "triton_load")
def _masked_load(ctx, eqn, invals, used):
    ref, *rest = invals
    transforms, extra = _split_transforms(eqn, rest)
    it = iter(extra)
    mask = next(it) if eqn.params.get("has_mask") else None
    other = next(it) if eqn.params.get("has_other") else None
    return [refs.load(ctx.em, ref, transforms, mask=mask, other=other, extra=_hints(eqn))]


@special("masked_swap", "triton_store")
def _masked_swap(ctx, eqn, invals, used):
    ref, val, *rest = invals
    transforms, extra = _split_transforms(eqn, rest)
    mask = extra[0] if eqn.params.get("has_mask") else None
    want = bool(eqn.outvars) and eqn.outvars[0] in used
    old = refs.store(ctx.em, ref, transforms, val, mask=mask, want_old=want,
                     extra=_hints(eqn))
    return [old if old is not None else val] if eqn.outvars else []


@special("atomic_rmw")
def _atomic_rmw(ctx, eqn, invals, used):
    ref, val, *rest = invals
    transforms, extra = _split_transforms(eqn, rest)
    mask = extra[0] if eqn.params["has_mask"] else None
    return [refs.atomic(ctx.em, eqn.params["op"], ref, transforms, val, mask=mask)]


@special("atomic_cas")
def _atomic_cas(ctx, eqn, invals, used):
    ref, cmp, val, *rest = invals
    transforms, _ = _split_transforms(eqn, rest)
    return [refs.atomic(ctx.em, "cas", ref, transforms, val, mask=None, cmp=cmp)]


@special("triton_elementwise_inline_asm")
def _inline_asm(ctx, eqn, invals, used):
    p = eqn.params
    outs = [(tuple(r.shape), r.dtype) for r in p["result_shape_dtypes"]]
    dtypes = [tl_dtype(d) for _, d in outs]
    dtype_arg = dtypes[0] if len(dtypes) == 1 else "(" + ", ".join(dtypes) + ",)"
    args = ", ".join(v.expr for v in invals)
    names = [ctx.em.fresh("asm") for _ in outs]
    target = names[0] if len(names) == 1 else ", ".join(names)
    ctx.em.line(f"{target} = tl.inline_asm_elementwise({p['asm']!r}, {p['constraints']!r}, "
                f"[{args}], dtype={dtype_arg}, is_pure=True, pack={int(p['pack'])})")
    return [Value(n, s, d) for n, (s, d) in zip(names, outs)]


@special("run_scoped")
def _run_scoped(ctx, eqn, invals, used):
    jaxpr = eqn.params["jaxpr"]
    news = [_alloc_local(ctx.em, t, f"run_scoped buffer {i}", "scoped")
            for i, t in enumerate(eqn.params["types"])]
    return lower_jaxpr(ctx, jaxpr, [], [*invals, *news])


@special("debug_print")
def _debug_print(ctx, eqn, invals, used):
    fmt = eqn.params["fmt"]
    prefix = fmt.split("{")[0] if "{" in fmt else fmt
    args = ", ".join(v.expr for v in invals)
    ctx.em.line(f"tl.device_print({prefix!r}{', ' if args else ''}{args})")
    return []


@special("debug_check")
def _debug_check(ctx, eqn, invals, used):
    (cond,) = invals
    ctx.em.line(f"tl.device_assert({cond.expr}, {eqn.params['message']!r})")
    return []


@special("delay")
def _delay(ctx, eqn, invals, used):
    return []


@special("debug_barrier")
def _debug_barrier(ctx, eqn, invals, used):
    ctx.em.line("tl.debug_barrier()")
    return []


# -- calls and control flow ----------------------------------------------------------------


def _closed(j):
    """(open jaxpr, const Values) for a ClosedJaxpr or Jaxpr parameter."""
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, [_const_value(c) for c in j.consts]
    return j, []


@special("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
         "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin")
def _inline(ctx, eqn, invals, used):
    p = eqn.params
    sub = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
    if sub is None:
        raise unsupported(f"the call primitive {eqn.primitive.name!r}")
    jaxpr, consts = _closed(sub)
    n = len(jaxpr.invars)
    return lower_jaxpr(ctx, jaxpr, consts, invals[len(invals) - n:])


def _carry_vars(ctx, vals) -> list[Value]:
    """Fresh, typed variables initialised from ``vals`` (loop carries, branch results)."""
    out = []
    for v in vals:
        if isinstance(v, (GlobalRef, LocalRef)):
            out.append(v)
            continue
        t = typed(ctx.em, v)
        out.append(ctx.em.assign(t.expr, v.shape, v.dtype, prefix="c"))
    return out


def _assign_all(ctx, targets: list[Value], vals: list[Value]) -> None:
    tmps = []
    for v in vals:
        tmps.append(typed(ctx.em, v) if v.literal else v)
    # Copy first, so that a carry passed through to another position reads its old value.
    staged = [ctx.em.assign(t.expr, t.shape, t.dtype, prefix="t") for t in tmps]
    for tgt, s in zip(targets, staged):
        ctx.em.line(f"{tgt.expr} = {s.expr}")


@special("cond")
def _cond(ctx, eqn, invals, used):
    branches = eqn.params["branches"]
    index, *ops = invals
    out_avals = [v.aval for v in eqn.outvars]
    results = []
    em = ctx.em
    for aval in out_avals:
        shape = tuple(aval.shape)
        results.append(em.assign(f"tl.zeros({list(shape)}, {tl_dtype(aval.dtype)})",
                                 shape, aval.dtype, prefix="r"))
    if index.literal:
        jaxpr, consts = _closed(branches[int(index.expr)])
        outs = lower_jaxpr(ctx, jaxpr, consts, ops)
        return outs
    idx = index.expr
    if len(branches) == 2:
        conds = [f"{idx} == 0", None]
    else:
        conds = [f"{idx} <= {i}" if i == 0 else f"{idx} == {i}" for i in range(len(branches) - 1)]
        conds.append(None)
    for i, (br, c) in enumerate(zip(branches, conds)):
        if c is not None:
            em.line(("if " if i == 0 else "elif ") + f"{c}:")
        else:
            em.line("else:")
        with em.indent():
            start = len(em.lines)
            jaxpr, consts = _closed(br)
            outs = lower_jaxpr(ctx, jaxpr, consts, ops)
            if results:
                _assign_all(ctx, results, outs)
            if len(em.lines) == start:
                em.line("pass")
    # Triton's if/elif/else: the last "else" also catches out-of-range indices, as
    # lax.cond clamps the index.
    return results


@special("scan")
def _scan(ctx, eqn, invals, used):
    """``for`` over the carries; ``xs`` rows are selected and ``ys`` rows placed with
    masks over the leading axis (Triton tensors cannot be indexed by a loop index)."""
    p = eqn.params
    nc, ncarry, length = p["num_consts"], p["num_carry"], int(p["length"])
    jaxpr, jconsts = _closed(p["jaxpr"])
    consts, carry, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    y_avals = [v.aval for v in jaxpr.outvars[ncarry:]]
    if xs or y_avals:
        check_pow2((length,), "lax.scan over arrays (its length)")
    em = ctx.em
    carries = _carry_vars(ctx, carry)
    ys = []
    for aval in y_avals:
        shape = (length, *aval.shape)
        ys.append(em.assign(f"tl.zeros({list(shape)}, {tl_dtype(aval.dtype)})", shape,
                            aval.dtype, prefix="ys"))
    it = em.fresh("it")
    em.line(f"for {it} in range(0, {length}):")
    with em.indent():
        start = len(em.lines)
        idx = f"({length - 1} - {it})" if p.get("reverse") else it
        rows = []
        for x in xs:
            rank = len(x.shape)
            sel = _row_selector(idx, length, rank)
            wide = f"{x.expr}.to(tl.float32)" if dtype_name(x.dtype) == "bfloat16" else x.expr
            zero = "0" if not np.dtype(x.dtype) == np.bool_ else "False"
            rows.append(em.assign(
                f"tl.sum(tl.where({sel}, {wide}, {zero}), axis=0).to({tl_dtype(x.dtype)})",
                x.shape[1:], x.dtype))
        outs = lower_jaxpr(ctx, jaxpr, jconsts, [*consts, *carries, *rows])
        new_carry, new_ys = outs[:ncarry], outs[ncarry:]
        placed = []
        for y, acc in zip(new_ys, ys):
            rank = len(acc.shape)
            sel = _row_selector(idx, length, rank)
            yv = typed(em, y)
            row = yv.expr if not yv.shape else f"{yv.expr}[None, {', '.join([':'] * len(yv.shape))}]"
            placed.append(Value(f"tl.where({sel}, {row}, {acc.expr})", acc.shape, acc.dtype))
        if carries or ys:
            _assign_all(ctx, [*carries, *ys], [*new_carry, *placed])
        if len(em.lines) == start:
            em.line("pass")
    return [*carries, *ys]


def _row_selector(idx: str, length: int, rank: int) -> str:
    ar = f"tl.arange(0, {length})"
    if rank > 1:
        ar = f"{ar}[:, {', '.join(['None'] * (rank - 1))}]"
    return f"({ar} == {idx})"


@special("while")
def _while(ctx, eqn, invals, used):
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cjaxpr, cconsts = _closed(p["cond_jaxpr"])
    bjaxpr, bconsts = _closed(p["body_jaxpr"])
    cargs, bargs, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
    carries = _carry_vars(ctx, init)
    em = ctx.em
    if _is_fori(cjaxpr, cconsts, bjaxpr, bn):
        # A fori_loop with traced bounds: a ``for`` over ``range(lo, hi)``, which
        # Triton's software pipeliner handles (it does not pipeline ``while`` loops).
        it = em.fresh("it")
        em.line(f"for {it} in range({carries[0].expr}, {carries[1].expr}):")
        with em.indent():
            outs = lower_jaxpr(ctx, bjaxpr, bconsts, [*bargs, *carries])
            _assign_all(ctx, carries, outs)
        return carries
    (pred,) = lower_jaxpr(ctx, cjaxpr, cconsts, [*cargs, *carries])
    pvar = em.assign(typed(em, pred).expr, (), np.bool_, prefix="pred")
    em.line(f"while {pvar.expr}:")
    with em.indent():
        outs = lower_jaxpr(ctx, bjaxpr, bconsts, [*bargs, *carries])
        if carries:
            _assign_all(ctx, carries, outs)
        (pred2,) = lower_jaxpr(ctx, cjaxpr, cconsts, [*cargs, *carries])
        em.line(f"{pvar.expr} = {typed(em, pred2).expr}")
    return carries


def _is_fori(cjaxpr, cconsts, bjaxpr, bn: int) -> bool:
    """Whether a ``while`` is ``lax.fori_loop``'s: carries ``(i, upper, *x)``, condition
    ``i < upper``, body ``(i + 1, upper, ...)`` with ``upper`` passed through."""
    if cconsts or len(cjaxpr.invars) < 2 or len(cjaxpr.eqns) != 1:
        return False
    (ceqn,) = cjaxpr.eqns
    i, upper = cjaxpr.invars[:2]
    if (ceqn.primitive.name != "lt" or list(ceqn.invars) != [i, upper]
            or list(ceqn.outvars) != list(cjaxpr.outvars)
            or i.aval.dtype != upper.aval.dtype or i.aval.shape != ()
            or not np.issubdtype(i.aval.dtype, np.integer)):
        return False
    bi, bupper = bjaxpr.invars[bn:bn + 2]
    if bjaxpr.outvars[1] is not bupper:
        return False
    for e in bjaxpr.eqns:
        if e.outvars and e.outvars[0] is bjaxpr.outvars[0]:
            one = e.invars[1] if len(e.invars) == 2 else None
            return (e.primitive.name == "add" and e.invars[0] is bi
                    and getattr(one, "val", None) is not None and int(one.val) == 1)
    return False


def describe(lowered: LoweredKernel) -> str:
    """A short, human-readable header for the generated source."""
    return (f"# Pallas Triton kernel {lowered.name}: grid {lowered.grid} -> launch grid "
            f"{lowered.launch_grid}, num_warps={lowered.num_warps}, "
            f"num_stages={lowered.num_stages}\n")

