"""How the Pallas grid maps onto Triton programs.

Each grid point is one Triton program, except along *sequential* axes (reduction axes
that no output's index map uses), which run as a loop inside each program so revisited
output blocks and scratch carry over as in the interpreter. Grids of more than three
axes (or oversized ones) are collapsed into launch axis 0.
"""

from __future__ import annotations

import math

import numpy as np
from jax import lax
from jax.extend import core as jex

from pallas import plugins
from pallas_triton._src.codegen import unsupported
from pallas_triton._src.lowering.engine import LoweringContext, jaxpr_and_consts

MAX_GRID_AXES = 3
_MAX_YZ = 65535


def launch_grid(grid) -> tuple[tuple[int, int, int], bool]:
    """The Triton launch grid, and whether the Pallas grid was collapsed into axis 0."""
    if not grid:
        return (1, 1, 1), False
    if len(grid) <= MAX_GRID_AXES and all(g <= _MAX_YZ for g in grid[1:]):
        return tuple(grid) + (1,) * (MAX_GRID_AXES - len(grid)), False
    return (math.prod(grid), 1, 1), True


def emit_program_ids(ctx: LoweringContext, grid, collapsed: bool) -> None:
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
        used |= depends(bm.index_map_jaxpr.jaxpr, n)
    return [a for a in range(n) if a not in used and gm.grid[a] > 1]


def final_step_epilogue(jaxpr, axis: int, grid, allowed: set):
    """The kernel's last equation if it is ``pl.when(program_id(axis) == last)`` over
    ``allowed`` refs only (with an empty else branch); else None."""
    if not jaxpr.eqns:
        return None
    eqn = jaxpr.eqns[-1]
    if eqn.primitive is not lax.cond_p or eqn.outvars or len(eqn.params["branches"]) != 2:
        return None
    if jaxpr_and_consts(eqn.params["branches"][0])[0].eqns:
        return None
    if not all(not isinstance(v, jex.Literal) and v in allowed for v in eqn.invars[1:]):
        return None
    producers = {o: e for e in jaxpr.eqns for o in e.outvars}

    def const(v):
        if isinstance(v, jex.Literal):
            return int(v.val) if np.ndim(v.val) == 0 else None
        e = producers.get(v)
        if e is None:
            return None
        if e.primitive is plugins.num_programs_p:
            return int(grid[e.params["axis"]])
        if e.primitive in (lax.sub_p, lax.add_p):
            x, y = (const(u) for u in e.invars)
            if x is None or y is None:
                return None
            return x - y if e.primitive is lax.sub_p else x + y
        return None

    def is_pid(v):
        e = None if isinstance(v, jex.Literal) else producers.get(v)
        return e is not None and e.primitive is plugins.program_id_p and e.params["axis"] == axis

    idx = eqn.invars[0]
    e = producers.get(idx)
    if e is not None and e.primitive is lax.convert_element_type_p:
        e = producers.get(e.invars[0])
    if e is None or e.primitive is not lax.eq_p:
        return None
    x, y = e.invars
    if is_pid(x) and const(y) == grid[axis] - 1 or is_pid(y) and const(x) == grid[axis] - 1:
        return eqn
    return None


def depends(jaxpr, n_axes: int) -> set[int]:
    """The grid axes (leading invars) that some output of ``jaxpr`` depends on."""
    taint = {v: {i} for i, v in enumerate(jaxpr.invars[:n_axes])}
    for eqn in jaxpr.eqns:
        deps = set()
        for v in eqn.invars:
            if not isinstance(v, jex.Literal):
                deps |= taint.get(v, set())
        if deps:
            for o in eqn.outvars:
                taint[o] = deps
    out = set()
    for v in jaxpr.outvars:
        if not isinstance(v, jex.Literal):
            out |= taint.get(v, set())
    return out


def check_scratch_carry(jaxpr, gm, seq_axes, par_grid) -> None:
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
