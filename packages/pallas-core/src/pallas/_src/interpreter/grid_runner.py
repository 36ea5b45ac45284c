"""Runs a ``pallas_call`` on plain JAX values: the reference semantics of the grid.

Semantics: grid points run in lexicographic order; scratch persists across points;
each point reads its input blocks and its output blocks (the current contents of the
output, which starts uninitialised or as the aliased input) and writes its output
blocks back; edge blocks are padded (with uninitialised values) and writes outside the
array are dropped.

Speed: grid axes that provably do not interact are run as vectorised lanes
(``jax.vmap``); only the remaining axes loop. An axis may be vectorised when every
output block is a distinct, disjoint block for each value of the vectorised axes, no
scratch value flows from one lane into the next, aliased inputs are read only where
their own lane writes, and the kernel has no ordered side effects. Otherwise — and
whenever an opt-in check is on — the grid runs point by point.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas._src import config
from pallas._src.interpreter import analysis
from pallas._src.interpreter import blocks as B
from pallas._src.interpreter.evaluator import Cell, ErrorTable, KernelContext, eval_jaxpr
from pallas._src.memory import uninitialized_value
from pallas._src.primitives.scoped import fresh_cell


@dataclasses.dataclass(frozen=True)
class Checks:
    """Which opt-in checks are on for one interpretation."""

    bounds: bool = False
    uninitialized: bool = False
    debug: bool = False

    @classmethod
    def from_config(cls) -> Checks:
        return cls(
            bounds=config.enable_bounds_checks.value,
            uninitialized=config.enable_poison_buffers.value,
            debug=config.enable_debug_checks.value,
        )

    @property
    def any(self) -> bool:
        return self.bounds or self.uninitialized or self.debug


class InterpreterError(RuntimeError):
    """A check of the Pallas interpreter failed (bounds, uninitialised read, debug_check)."""


def _has_ordered_effects(jaxpr) -> bool:
    from pallas._src.primitives.debug import kernel_debug_effect

    return kernel_debug_effect in jaxpr.effects or any(
        "Debug" in type(e).__name__ or "Ordered" in type(e).__name__ for e in jaxpr.effects
    )


class _Plan:
    """Buffers, paddings and index tables of one interpretation."""

    def __init__(self, gm, args, checks: Checks):
        self.gm = gm
        self.checks = checks
        nsp, nin = gm.num_scalar_prefetch, gm.num_inputs
        self.prefetch = list(args[:nsp])
        ins = list(args[nsp : nsp + nin])
        self.alias_of_out = {o: i - nsp for i, o in gm.input_output_aliases if i >= nsp}
        self.aliased_prefetch = {o: i for i, o in gm.input_output_aliases if i < nsp}
        in_bms, out_bms = gm.in_block_mappings, gm.out_block_mappings
        self.in_of_out = {}
        self.out_pads = []
        self.out_init = []
        for o, bm in enumerate(out_bms):
            pads = B.own_padding(bm)
            if o in self.alias_of_out:
                i = self.alias_of_out[o]
                pads = B.merge_padding(pads, B.own_padding(in_bms[i]))
                init = ins[i]
            elif o in self.aliased_prefetch:
                init = args[self.aliased_prefetch[o]]
            else:
                init = uninitialized_value(bm.array_aval.shape, bm.array_aval.dtype)
            self.out_pads.append(pads)
            self.out_init.append(B.pad_array(init, pads))
        self.in_pads, self.in_bufs = [], []
        self.reads_out = {i: o for o, i in self.alias_of_out.items()}
        for i, (bm, x) in enumerate(zip(in_bms, ins)):
            if i in self.reads_out:
                self.in_pads.append(self.out_pads[self.reads_out[i]])
                self.in_bufs.append(None)
            else:
                pads = B.own_padding(bm)
                self.in_pads.append(pads)
                self.in_bufs.append(B.pad_array(x, pads))
        self.tables = [analysis.index_table(bm, gm.grid) for bm in gm.block_mappings]
        self.starts = [
            None if t is None else analysis.start_table(bm, t)
            for bm, t in zip(gm.block_mappings, self.tables)
        ]

    # -- per grid point ------------------------------------------------------------
    def block_positions(self, ctx, prefetch_cells, grid_idx, k):
        """(starts, sizes, flat indices) of block mapping ``k`` at ``grid_idx``."""
        bm = self.gm.block_mappings[k]
        jaxpr = bm.index_map_jaxpr
        flat = eval_jaxpr(ctx, jaxpr.jaxpr, jaxpr.consts, [*grid_idx, *prefetch_cells])
        starts, sizes = B.block_starts(bm, flat)
        return starts, sizes, flat


def static_bounds_check(plan: _Plan) -> None:
    """Raises at trace time when a data-independent index map leaves its array."""
    gm = plan.gm
    coords = analysis.grid_coords(gm.grid)
    for bm, table, starts in zip(gm.block_mappings, plan.tables, plan.starts):
        if table is None or bm.whole or not len(table):
            continue
        bad = np.zeros(len(table), bool)
        c = 0
        for dim, (d, n) in enumerate(zip(bm.block_dims, bm.array_aval.shape)):
            s = starts[:, dim]
            if type(d).__name__ == "Blocked":
                bad |= (s < 0) | (s >= max(n, 1))
            elif type(d).__name__ == "Element":
                lo, hi = d.padding
                bad |= (s < -lo) | (s + d.block_size > n + hi)
            elif type(d).__name__ == "BoundedSlice":
                size = table[:, c + 1]
                bad |= (s < 0) | (size < 0) | (size > d.block_size) | (s + size > n)
            else:
                bad |= (s < 0) | (s >= n)
            c += 2 if type(d).__name__ == "BoundedSlice" else 1
        if bad.any():
            t = int(np.argmax(bad))
            point = tuple(int(c[t]) for c in coords)
            raise IndexError(
                f"block index out of bounds for {bm.origin} (array "
                f"{tuple(bm.array_aval.shape)}, block {bm.block_shape}): at grid iteration "
                f"{point} the index map returned {tuple(int(v) for v in table[t])}"
            )


# ------------------------------------------------------------------------------------
# Mode selection.


def choose_lanes(plan: _Plan, jaxpr, checks: Checks):
    """The grid axes to vectorise, or None to run point by point."""
    gm = plan.gm
    if checks.any or _has_ordered_effects(jaxpr.jaxpr):
        return None
    if gm.num_grid_points <= 1:
        return ()
    n_in = gm.num_inputs
    out_starts = plan.starts[n_in:]
    if any(s is None for s in out_starts):
        return None
    lanes: set[int] = set()
    for s in out_starts:
        lanes |= analysis.influencing_axes(s, gm.grid)
    lanes_t = tuple(sorted(lanes))
    seq = tuple(a for a in range(len(gm.grid)) if a not in lanes)
    grid = gm.grid
    for bm, s in zip(gm.out_block_mappings, out_starts):
        if not lanes_t:
            break
        # one row per lane (the table is constant along the sequential axes)
        lane_rows = s.reshape(*grid, -1)[tuple(slice(None) if a in lanes else 0
                                               for a in range(len(grid)))]
        lane_rows = lane_rows.reshape(-1, s.shape[1])
        if not analysis.rows_distinct(lane_rows) or not analysis.blocks_are_disjoint(bm):
            return None
    for o, i in plan.alias_of_out.items():
        a, b = plan.starts[i], plan.starts[n_in + o]
        if a is None or a.shape != b.shape or not np.array_equal(a, b):
            return None
        if gm.in_block_mappings[i].block_shape != gm.out_block_mappings[o].block_shape:
            return None
    if plan.aliased_prefetch:
        return None
    first_scratch = gm.num_scalar_prefetch + gm.num_inputs + gm.num_outputs
    known = {a: 0 for a in seq}
    if analysis.scratch_live_in(jaxpr, first_scratch, known, grid):
        return None if lanes_t else ()
    return lanes_t


# ------------------------------------------------------------------------------------
# Kernel invocation at one grid point.


def _run_kernel(plan, ctx, jaxpr, prefetch_cells, grid_idx, in_src, out_blocks, scratch):
    """Runs the kernel once; returns the new out-block values (cells updated in place)."""
    gm = plan.gm
    in_cells = []
    for i, bm in enumerate(gm.in_block_mappings):
        starts, _, _ = plan.block_positions(ctx, prefetch_cells, grid_idx, i)
        blk = B.load_block(in_src[i], bm, plan.in_pads[i], starts)
        in_cells.append(Cell(blk, bm.origin, None, bm.memory_space))
    eval_jaxpr(ctx, jaxpr.jaxpr, jaxpr.consts,
               [*prefetch_cells, *in_cells, *out_blocks, *scratch])


def _prefetch_cells(plan):
    return [Cell(x, f"scalar prefetch {i}") for i, x in enumerate(plan.prefetch)]


def _error_table(gm) -> ErrorTable:
    rank = max([len(bm.block_dims) for bm in gm.block_mappings] + [0])
    return ErrorTable(payload_size=len(gm.grid) + 2 * rank + 2)


def _raise_on_error(table: ErrorTable, gm, err):
    def callback(err):
        err = np.asarray(err)
        code = int(err[0])
        if code == 0:
            return
        msg = table.messages[code - 1]
        point = tuple(int(v) for v in err[1 : 1 + len(gm.grid)])
        raise InterpreterError(f"{msg}, at grid iteration {point}{_block_suffix(err, gm)}")

    jax.debug.callback(callback, err)


def _block_suffix(err, gm) -> str:
    n = len(gm.grid)
    rank = int(err[1 + n])
    if rank <= 0:
        return ""
    blk = tuple(int(v) for v in err[2 + n : 2 + n + rank])
    return f", block index {blk}"


# ------------------------------------------------------------------------------------
# Point-by-point execution (the general case, and the one with checks).


def run_sequential(plan: _Plan, jaxpr, checks: Checks):
    gm = plan.gm
    grid = gm.grid
    n = gm.num_grid_points
    table = _error_table(gm) if checks.any else None
    track = checks.uninitialized

    out_masks0 = []
    for o in range(gm.num_outputs):
        if not track:
            out_masks0.append(None)
        else:
            full = o in plan.alias_of_out or o in plan.aliased_prefetch
            out_masks0.append(jnp.full(plan.out_init[o].shape, full, jnp.bool_))
    scratch0 = [
        fresh_cell(t, origin, track) for t, origin in zip(gm.scratch_types, gm.scratch_origins)
    ]
    err0 = jnp.zeros((1 + table.payload_size,), jnp.int32) if table else None

    def body(t, carry):
        outs, masks, scratch_states, err = carry
        grid_idx = _unravel(t, grid)
        err_cell = Cell(err, "errors") if table else None
        ctx = KernelContext(grid_idx, grid, errors=table, error_cell=err_cell,
                            check_uninitialized=track, debug_checks=checks.debug)
        pcells = _prefetch_cells(plan)
        in_src = [outs[plan.reads_out[i]] if i in plan.reads_out else b
                  for i, b in enumerate(plan.in_bufs)]
        n_in = gm.num_inputs
        out_cells, positions = [], []
        for o, bm in enumerate(gm.out_block_mappings):
            starts, sizes, flat = plan.block_positions(ctx, pcells, grid_idx, n_in + o)
            positions.append((starts, sizes))
            blk = B.load_block(outs[o], bm, plan.out_pads[o], starts)
            mblk = None if masks[o] is None else B.load_block(
                masks[o], bm, plan.out_pads[o], starts)
            out_cells.append(Cell(blk, bm.origin, mblk, bm.memory_space))
        if checks.bounds:
            for k, bm in enumerate(gm.block_mappings):
                if bm.whole:
                    continue
                starts, sizes, flat = plan.block_positions(ctx, pcells, grid_idx, k)
                ctx.report(B.in_bounds(bm, starts, sizes),
                           f"block index out of bounds for {bm.origin} (array "
                           f"{tuple(bm.array_aval.shape)}, block {bm.block_shape})",
                           [*grid_idx, len(flat), *flat])
        scratch = [c.fork(s) for c, s in zip(scratch0, scratch_states)]
        _set_payload_hook(ctx, grid_idx, positions)
        _run_kernel(plan, ctx, jaxpr, pcells, grid_idx, in_src, out_cells, scratch)
        new_outs, new_masks = list(outs), list(masks)
        for o, bm in enumerate(gm.out_block_mappings):
            starts, sizes = positions[o]
            new_outs[o] = B.store_block(outs[o], bm, plan.out_pads[o], starts, sizes,
                                        out_cells[o].value)
            if masks[o] is not None:
                new_masks[o] = B.store_block(masks[o], bm, plan.out_pads[o], starts, sizes,
                                             out_cells[o].init)
        new_err = err_cell.value if err_cell is not None else err
        return new_outs, new_masks, [c.state() for c in scratch], new_err

    carry = (list(plan.out_init), out_masks0, [c.state() for c in scratch0], err0)
    if n == 1:
        carry = body(jnp.int32(0), carry)
    elif n > 1:
        carry = lax.fori_loop(0, n, body, carry)
    outs, _, _, err = carry
    if table is not None:
        _raise_on_error(table, gm, err)
    return outs


def _set_payload_hook(ctx, grid_idx, positions):
    """Makes every report carry the grid point (and, for blocks, the block index)."""
    report = ctx.report

    def report_with_point(ok, message, payload=None):
        if payload is None:
            payload = [*grid_idx, 0]
        report(ok, message, payload)

    ctx.report = report_with_point


def _unravel(t, grid):
    idx = []
    rem = jnp.asarray(t, jnp.int32)
    for g in reversed(grid):
        idx.append(rem % g)
        rem = rem // g
    return tuple(reversed(idx))


# ------------------------------------------------------------------------------------
# Vectorised execution: lanes over independent axes, a loop over the others.


def run_lanes(plan: _Plan, jaxpr, lanes: tuple[int, ...]):
    gm = plan.gm
    grid = gm.grid
    seq = tuple(a for a in range(len(grid)) if a not in lanes)
    lane_grid = tuple(grid[a] for a in lanes)
    seq_grid = tuple(grid[a] for a in seq)
    n_seq = math.prod(seq_grid)
    n_in = gm.num_inputs
    in_src = [plan.out_init[plan.reads_out[i]] if i in plan.reads_out else b
              for i, b in enumerate(plan.in_bufs)]

    def lane(*lane_idx):
        def grid_point(s):
            seq_idx = _unravel(s, seq_grid)
            full = [None] * len(grid)
            for a, v in zip(lanes, lane_idx):
                full[a] = v
            for a, v in zip(seq, seq_idx):
                full[a] = v
            return tuple(full)

        ctx0 = KernelContext(grid_point(0), grid)
        pcells = _prefetch_cells(plan)
        out_pos = [
            plan.block_positions(ctx0, pcells, grid_point(0), n_in + o)[:2]
            for o in range(gm.num_outputs)
        ]
        out_blocks0 = [
            B.load_block(plan.out_init[o], bm, plan.out_pads[o], out_pos[o][0])
            for o, bm in enumerate(gm.out_block_mappings)
        ]
        scratch0 = [fresh_cell(t, origin, False)
                    for t, origin in zip(gm.scratch_types, gm.scratch_origins)]

        def step(s, carry):
            outs, scratch_states = carry
            gi = grid_point(s)
            ctx = KernelContext(gi, grid)
            out_cells = [Cell(v, bm.origin, None, bm.memory_space)
                         for v, bm in zip(outs, gm.out_block_mappings)]
            scratch = [c.fork(st) for c, st in zip(scratch0, scratch_states)]
            _run_kernel(plan, ctx, jaxpr, _prefetch_cells(plan), gi, in_src, out_cells,
                        scratch)
            return [c.value for c in out_cells], [c.state() for c in scratch]

        carry = (out_blocks0, [c.state() for c in scratch0])
        if n_seq == 1:
            carry = step(jnp.int32(0), carry)
        elif n_seq > 1:
            carry = lax.fori_loop(0, n_seq, step, carry)
        return carry[0]

    if lanes:
        coords = analysis.grid_coords(lane_grid)
        blocks = jax.vmap(lane)(*[jnp.asarray(c) for c in coords])
        n_lanes = len(coords[0])
    else:
        blocks = [b[None] for b in lane()]
        n_lanes = 1
    return _scatter_blocks(plan, blocks, lanes, lane_grid, n_lanes)


def _scatter_blocks(plan, blocks, lanes, lane_grid, n_lanes):
    """Writes each lane's output blocks into the output buffers."""
    gm = plan.gm
    n_in = gm.num_inputs
    grid = gm.grid
    # The grid point that starts each lane: sequential axes at zero.
    lane_coords = analysis.grid_coords(lane_grid) if lanes else []
    point = np.zeros(n_lanes, np.int64)
    strides = np.cumprod((1,) + tuple(reversed(grid)))[:-1][::-1] if grid else ()
    for a, c in zip(lanes, lane_coords):
        point += c.astype(np.int64) * int(strides[a])
    outs = []
    for o, bm in enumerate(gm.out_block_mappings):
        starts_tab = plan.starts[n_in + o][point]
        sizes_tab = _sizes_table(bm, plan.tables[n_in + o][point])
        buf = plan.out_init[o]
        tiled = _tiled_scatter(bm, plan.out_pads[o], starts_tab, blocks[o], buf)
        if tiled is not None:
            outs.append(tiled)
            continue
        starts_arr = jnp.asarray(starts_tab, jnp.int32)
        sizes_arr = None if sizes_tab is None else jnp.asarray(sizes_tab, jnp.int32)

        def body(k, buf, bm=bm, o=o, starts_arr=starts_arr, sizes_arr=sizes_arr):
            starts = [starts_arr[k, d] for d in range(len(bm.block_dims))]
            sizes = [None] * len(bm.block_dims)
            if sizes_arr is not None:
                sizes = [None if sizes_arr.shape[1] <= d else sizes_arr[k, d]
                         for d in range(len(bm.block_dims))]
            return B.store_block(buf, bm, plan.out_pads[o], starts, sizes, blocks[o][k])

        outs.append(lax.fori_loop(0, n_lanes, body, buf) if n_lanes > 1 else body(0, buf))
    return outs


def _sizes_table(bm, table):
    if not any(type(d).__name__ == "BoundedSlice" for d in bm.block_dims):
        return None
    cols, c = [], 0
    for d in bm.block_dims:
        if type(d).__name__ == "BoundedSlice":
            cols.append(table[:, c + 1])
            c += 2
        else:
            cols.append(np.full(len(table), -1))
            c += 1
    return np.stack(cols, axis=1)


def _tiled_scatter(bm, pads, starts_tab, lane_blocks, buf):
    """When the lanes' blocks tile the padded buffer exactly, one transpose places them."""
    if not analysis.blocks_are_disjoint(bm) or any(lo for lo, _ in pads):
        return None
    shape = buf.shape
    bshape = bm.block_shape
    counts = [s // b if s % b == 0 else None for s, b in zip(shape, bshape)]
    if any(c is None for c in counts) or math.prod(counts) != len(starts_tab):
        return None
    block_idx = starts_tab // np.asarray(bshape)
    # the lanes must enumerate the block grid in row-major order
    expected = np.stack(np.unravel_index(np.arange(len(starts_tab)), counts), axis=1)
    if not np.array_equal(block_idx, expected):
        return None
    x = lane_blocks.reshape(*counts, *bshape)
    nd = len(shape)
    perm = [p for i in range(nd) for p in (i, nd + i)]
    return x.transpose(perm).reshape(shape)


# ------------------------------------------------------------------------------------


def interpret_pallas_call(*args, jaxpr, grid_mapping, checks: Checks | None = None):
    """Runs the kernel on ``args`` with the reference semantics; returns the outputs."""
    gm = grid_mapping
    checks = Checks.from_config() if checks is None else checks
    plan = _Plan(gm, args, checks)
    if checks.bounds:
        static_bounds_check(plan)
    if gm.num_grid_points == 0:
        outs = list(plan.out_init)
    else:
        lanes = choose_lanes(plan, jaxpr, checks)
        if lanes is None:
            outs = run_sequential(plan, jaxpr, checks)
        else:
            outs = run_lanes(plan, jaxpr, lanes)
    return [
        B.unpad_array(x, pads, bm.array_aval.shape)
        for x, pads, bm in zip(outs, plan.out_pads, gm.out_block_mappings)
    ]
