"""Runs a ``pallas_call`` on plain JAX values: the reference semantics of the grid.

Semantics: grid points run in lexicographic order; scratch persists across points, and
so do the kernel's writes to its scalar-prefetch refs (index maps see those one point
late, as on a TPU, whose pipeline works out the next point's blocks before the body
runs); each point reads its input blocks and its output blocks (the current contents of
the output, which starts uninitialised or as the aliased input) and writes its output
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
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas._src import config
from pallas._src.interpreter import analysis
from pallas._src.interpreter import blocks as B
from pallas._src.interpreter import prng as _prng_rules  # noqa: F401 (registers its rules)
from pallas._src.interpreter.evaluator import Cell, ErrorTable, KernelContext, eval_jaxpr
from pallas._src.interpreter.kernel_state import live_in, states_used_by
from pallas._src.interpreter.rules import interpret_schedules
from pallas._src.memory import is_semaphore_space, uninitialized_value
from pallas._src.primitives.debug import kernel_debug_effect
from pallas._src.primitives.scoped import fresh_cell
from pallas._src.registry.registry import ensure_discovered


@dataclasses.dataclass(frozen=True)
class Checks:
    """Which opt-in checks are on for one interpretation."""

    bounds: bool = False
    uninitialized: bool = False
    debug: bool = False
    vectorize: bool = True  # False: always run point by point (for debugging)

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
    return kernel_debug_effect in jaxpr.effects or any(
        "Debug" in type(e).__name__ or "Ordered" in type(e).__name__ for e in jaxpr.effects
    )


class _Plan:
    """Buffers, paddings and index tables of one interpretation."""

    def __init__(self, gm, args, checks: Checks, grid=None):
        self.gm = gm
        self.checks = checks
        # The grid being run: gm.grid, with dynamic sizes as traced int32 scalars.
        self.grid = gm.grid if grid is None else grid
        # Run-time grid sizes or symbolic shapes (jax.export): no trace-time index tables.
        self.dynamic = gm.num_dynamic_grid_bounds > 0 or any(
            bm.symbolic for bm in gm.block_mappings)
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
            elif is_semaphore_space(bm.memory_space):
                # A semaphore output starts at count 0, as one allocated on the device:
                # a DMA signals it by its size and the next kernel waits it down.
                init = jnp.zeros(bm.array_aval.shape, bm.array_aval.dtype)
            else:
                init = uninitialized_value(bm.array_aval.shape, bm.array_aval.dtype)
            self.out_pads.append(pads)
            self.out_init.append(B.pad_array(init, pads))
        # Inputs are read from their original values, aliased or not (as upstream's
        # interpreter does): the aliased output starts as a copy of its input.
        self.in_pads, self.in_bufs = [], []
        for bm, x in zip(in_bms, ins):
            pads = B.own_padding(bm)
            self.in_pads.append(pads)
            self.in_bufs.append(B.pad_array(x, pads))
        # Index tables need every grid point at trace time: none for a dynamic grid.
        self.tables = [None if self.dynamic else analysis.index_table(bm, gm.grid)
                       for bm in gm.block_mappings]
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
    for bm, table, starts in zip(gm.block_mappings, plan.tables, plan.starts):
        if table is None or bm.whole or not table.size:
            continue
        compact = table.shape[:-1]
        table, starts = analysis.flat_rows(table), analysis.flat_rows(starts)
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
            # the first such point in row-major order (axes the map ignores at 0)
            point = tuple(int(i) for i in np.unravel_index(t, compact))
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
    if (plan.dynamic or checks.any or not checks.vectorize
            or _has_ordered_effects(jaxpr.jaxpr)
            or analysis.writes_refs(jaxpr.jaxpr, range(gm.num_scalar_prefetch))):
        # (a scalar-prefetch value the kernel writes flows from each point to the next)
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
    if math.prod(gm.grid[a] for a in lanes_t) > analysis.MAX_TABLE_POINTS:
        return None  # too many lanes to vectorise (or to tabulate): point by point
    seq = tuple(a for a in range(len(gm.grid)) if a not in lanes)
    grid = gm.grid
    for bm, s in zip(gm.out_block_mappings, out_starts):
        if not lanes_t:
            break
        # one row per lane (the table is constant along the sequential axes)
        lane_rows = analysis.lane_rows(s, grid, lanes_t)
        if not analysis.rows_distinct(lane_rows) or not analysis.blocks_are_disjoint(bm):
            return None
    if lanes_t and live_in(jaxpr.jaxpr, states_used_by(jaxpr.jaxpr)):
        return None  # a step reads the kernel state that the step before it left
    first_scratch = gm.num_scalar_prefetch + gm.num_inputs + gm.num_outputs
    known = {a: 0 for a in seq}
    if analysis.scratch_live_in(jaxpr, first_scratch, known, grid):
        return None if lanes_t else ()
    return lanes_t


# ------------------------------------------------------------------------------------
# Kernel invocation at one grid point.


def _run_kernel(plan, ctx, jaxpr, prefetch_cells, grid_idx, in_src, out_blocks, scratch,
                index_cells=None):
    """Runs the kernel once; returns the new out-block values (cells updated in place).

    ``index_cells`` are the scalar-prefetch values the input index maps read (by default
    ``prefetch_cells``, the ones the kernel body sees)."""
    gm = plan.gm
    index_cells = prefetch_cells if index_cells is None else index_cells
    in_cells = []
    for i, bm in enumerate(gm.in_block_mappings):
        starts, _, _ = plan.block_positions(ctx, index_cells, grid_idx, i)
        blk = B.load_block(in_src[i], bm, plan.in_pads[i], starts)
        in_cells.append(Cell(blk, bm.origin, None, bm.memory_space))
    eval_jaxpr(ctx, jaxpr.jaxpr, jaxpr.consts,
               [*prefetch_cells, *in_cells, *out_blocks, *scratch])


def _prefetch_cells(plan, values=None):
    values = plan.prefetch if values is None else values
    return [Cell(x, f"scalar prefetch {i}") for i, x in enumerate(values)]


def _initial_states(jaxpr) -> dict:
    """The declared kernel states the kernel may use, at their initial values, by name."""
    return {st.name: st.init() for st in states_used_by(jaxpr.jaxpr)}


def _enter_states(ctx, values: dict) -> None:
    """Gives ``ctx`` the kernel-state cells holding ``values`` (the carried state)."""
    ctx.states = {k: Cell(v, f"the kernel state {k!r}") for k, v in values.items()}


def _state_values(ctx, carried: dict) -> dict:
    """The new values of the carried states (a state a rule starts itself is the step's)."""
    return {k: ctx.states[k].value for k in carried}


# Keyed by the kernel jaxpr itself, weakly: a table lives as long as its kernel, and a
# new kernel never finds the table of a dead one whose id it reuses.
_error_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def error_table_for(jaxpr, gm) -> ErrorTable:
    """The message table of a kernel's checks (kept so results can be decoded later)."""
    table = _error_tables.get(jaxpr)
    if table is None:
        rank = max([len(bm.block_dims) for bm in gm.block_mappings] + [0])
        table = _error_tables[jaxpr] = ErrorTable(payload_size=len(gm.grid) + 2 * rank + 2)
    return table


def error_vector_size(gm) -> int:
    rank = max([len(bm.block_dims) for bm in gm.block_mappings] + [0])
    return 1 + len(gm.grid) + 2 * rank + 2


def decode_error(jaxpr, gm, err) -> str | None:
    """The message of a failed check recorded in ``err``, or None if all passed."""
    err = np.asarray(err)
    code = int(err[0])
    if code == 0:
        return None
    msg = error_table_for(jaxpr, gm).messages[code - 1]
    point = tuple(int(v) for v in err[1 : 1 + len(gm.grid)])
    return f"{msg}, at grid iteration {point}{_block_suffix(err, gm)}"


def raise_if_error(jaxpr, gm, err) -> None:
    """Raises InterpreterError now (concrete ``err``) or when the computation runs."""

    def check(err):
        msg = decode_error(jaxpr, gm, err)
        if msg is not None:
            raise InterpreterError(msg)

    if isinstance(err, jax.core.Tracer):
        jax.debug.callback(check, err)
    else:
        check(err)


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
    grid = plan.grid
    # A dynamic grid loops to a traced trip count (a while loop); a static one unrolls a
    # single point or runs a counted loop.
    n = _grid_size(grid) if plan.dynamic else gm.num_grid_points
    table = error_table_for(jaxpr, gm) if checks.any else None
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

    n_in = gm.num_inputs
    out_bms = gm.out_block_mappings

    def pos_vector(bm, starts, sizes):
        if not starts:
            return jnp.zeros((0,), jnp.int32)
        return jnp.stack([jnp.asarray(x, jnp.int32) for x in starts]
                         + [jnp.int32(-1) if x is None else jnp.asarray(x, jnp.int32)
                            for x in sizes])

    def unpos(bm, vec):
        nd = len(bm.block_dims)
        starts = [vec[d] for d in range(nd)]
        sizes = [vec[nd + d] if _is_bounded(d_) else None
                 for d, d_ in enumerate(bm.block_dims)]
        return starts, sizes

    def write_back(o, buf, blk, vec):
        starts, sizes = unpos(out_bms[o], vec)
        return B.store_block(buf, out_bms[o], plan.out_pads[o], starts, sizes, blk)

    def advance(o, buf, blk, old_pos, new_starts, changed, flush):
        """Writes ``blk`` back if ``flush``; loads the block at ``new_starts`` if ``changed``."""
        bm, pads = out_bms[o], plan.out_pads[o]
        buf = lax.cond(flush, lambda b, k: write_back(o, b, k, old_pos), lambda b, k: b,
                       buf, blk)
        blk = lax.cond(changed, lambda b, k: B.load_block(b, bm, pads, new_starts),
                       lambda b, k: k, buf, blk)
        return buf, blk

    def body(t, carry):
        (outs, masks, blocks, mblocks, poss, scratch_states, err, kstates, pvals,
         pvals_seen) = carry
        grid_idx = _unravel(t, grid)
        err_cell = Cell(err, "errors") if table else None
        ctx = KernelContext(grid_idx, grid, axis_names=gm.grid_names, errors=table,
                            error_cell=err_cell,
                            check_uninitialized=track, debug_checks=checks.debug)
        _enter_states(ctx, kstates)
        # The kernel's writes to its scalar-prefetch refs persist (SMEM on a TPU); the
        # index maps of this point see the values as they were when the previous point
        # began (``pvals_seen``), as a TPU's pipeline evaluates them one point ahead.
        kernel_pcells = _prefetch_cells(plan, pvals)
        pcells = _prefetch_cells(plan, pvals_seen)
        outs, masks, blocks, mblocks = list(outs), list(masks), list(blocks), list(mblocks)
        out_cells = []
        for o, bm in enumerate(out_bms):
            # An output block stays in place while its index repeats; when the index
            # changes, the old block is written back and the new one loaded.
            starts, sizes, flat = plan.block_positions(ctx, pcells, grid_idx, n_in + o)
            new_pos = pos_vector(bm, starts, sizes)
            changed = (t == 0) | jnp.any(new_pos != poss[o])
            flush = changed & (t > 0)
            outs[o], blocks[o] = advance(o, outs[o], blocks[o], poss[o], starts, changed, flush)
            if masks[o] is not None:
                masks[o], mblocks[o] = advance(o, masks[o], mblocks[o], poss[o], starts,
                                               changed, flush)
            poss[o] = new_pos
            out_cells.append(Cell(blocks[o], bm.origin, mblocks[o], bm.memory_space, flat))
        in_src = plan.in_bufs
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
        _run_kernel(plan, ctx, jaxpr, kernel_pcells, grid_idx, in_src, out_cells, scratch,
                    index_cells=pcells)
        blocks = [c.value for c in out_cells]
        mblocks = [c.init for c in out_cells]
        new_err = err_cell.value if err_cell is not None else err
        return (outs, masks, blocks, mblocks, poss, [c.state() for c in scratch], new_err,
                _state_values(ctx, kstates), [c.value for c in kernel_pcells], list(pvals))

    blocks0 = [jnp.zeros(bm.ref_shape, bm.array_aval.dtype) for bm in out_bms]
    mblocks0 = [None if m is None else jnp.zeros(bm.ref_shape, jnp.bool_)
                for m, bm in zip(out_masks0, out_bms)]
    poss0 = [jnp.zeros((2 * len(bm.block_dims),), jnp.int32) for bm in out_bms]
    carry = (list(plan.out_init), out_masks0, blocks0, mblocks0, poss0,
             [c.state() for c in scratch0], err0, _initial_states(jaxpr),
             [jnp.asarray(x) for x in plan.prefetch], [jnp.asarray(x) for x in plan.prefetch])
    if plan.dynamic:
        carry = lax.fori_loop(jnp.int32(0), n, body, carry)
    elif n == 1:
        carry = body(jnp.int32(0), carry)
    elif n > 1:
        carry = lax.fori_loop(0, n, body, carry)
    outs, masks, blocks, mblocks, poss, _, err, _, _, _ = carry
    if plan.dynamic:  # an empty grid wrote nothing: there is no block to write back
        outs = [lax.cond(n > 0, lambda b, k, o=o: write_back(o, b, k, poss[o]),
                         lambda b, k: b, outs[o], blocks[o])
                for o in range(gm.num_outputs)]
    else:
        outs = [write_back(o, outs[o], blocks[o], poss[o]) for o in range(gm.num_outputs)]
    return outs, err


def _grid_size(grid):
    """The number of points of a grid with traced sizes (an int32 scalar)."""
    n = jnp.int32(1)
    for g in grid:
        n = n * jnp.asarray(g, jnp.int32)
    return n


def _unravel(t, grid):
    idx = []
    rem = jnp.asarray(t, jnp.int32)
    for g in reversed(grid):
        idx.append(rem % g)
        rem = rem // g
    return tuple(reversed(idx))


# ------------------------------------------------------------------------------------
# Vectorised execution: lanes over independent axes, a loop over the others.


def run_lanes(plan: _Plan, jaxpr, lanes: tuple[int, ...], outer: tuple[int, ...] = ()):
    """Vectorises the ``lanes`` axes, loops over the rest.

    ``outer`` axes (a subset of the independent axes) run as an outer loop around the
    vectorised lanes instead of inside them: used for axes that set a loop's trip count
    in the kernel, where vectorising would run every lane for the longest trip.
    """
    gm = plan.gm
    grid = gm.grid
    inner = tuple(a for a in lanes if a not in outer)
    seq = tuple(a for a in range(len(grid)) if a not in lanes)
    inner_grid = tuple(grid[a] for a in inner)
    outer_grid = tuple(grid[a] for a in outer)
    seq_grid = tuple(grid[a] for a in seq)
    n_seq = math.prod(seq_grid)
    n_in = gm.num_inputs
    in_src = plan.in_bufs

    def lane(outer_idx, *lane_idx):
        def grid_point(s):
            full = [None] * len(grid)
            for axes, vals in ((outer, outer_idx), (inner, lane_idx),
                               (seq, _unravel(s, seq_grid))):
                for a, v in zip(axes, vals):
                    full[a] = v
            return tuple(full)

        ctx0 = KernelContext(grid_point(0), grid, axis_names=gm.grid_names)
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
            outs, scratch_states, kstates = carry
            gi = grid_point(s)
            ctx = KernelContext(gi, grid, axis_names=gm.grid_names)
            _enter_states(ctx, kstates)
            out_cells = [Cell(v, bm.origin, None, bm.memory_space)
                         for v, bm in zip(outs, gm.out_block_mappings)]
            scratch = [c.fork(st) for c, st in zip(scratch0, scratch_states)]
            _run_kernel(plan, ctx, jaxpr, _prefetch_cells(plan), gi, in_src, out_cells,
                        scratch)
            return ([c.value for c in out_cells], [c.state() for c in scratch],
                    _state_values(ctx, kstates))

        carry = (out_blocks0, [c.state() for c in scratch0], _initial_states(jaxpr))
        if n_seq == 1:
            carry = step(jnp.int32(0), carry)
        elif n_seq > 1:
            carry = lax.fori_loop(0, n_seq, step, carry)
        starts = [[jnp.asarray(x, jnp.int32) for x in pos[0]] for pos in out_pos]
        sizes = [[jnp.int32(-1) if x is None else jnp.asarray(x, jnp.int32) for x in pos[1]]
                 for pos in out_pos]
        return carry[0], starts, sizes

    # One vmap per lane axis (not one over the flattened lanes): an input whose block
    # does not move along an axis stays unbatched there, so e.g. the blocks of a tiled
    # matmul meet in one large dot instead of many small batched ones.
    f = lane
    for k in reversed(range(len(inner))):
        in_axes = (None,) + tuple(0 if j == k else None for j in range(len(inner)))
        f = jax.vmap(f, in_axes=in_axes)
    n_inner = math.prod(inner_grid)
    lane_args = [jnp.arange(g, dtype=jnp.int32) for g in inner_grid]

    def flat_lanes(outer_idx):
        blocks, starts, sizes = f(outer_idx, *lane_args)
        flat = lambda x: jnp.reshape(x, (n_inner, *jnp.shape(x)[len(inner):]))  # noqa: E731
        return jax.tree_util.tree_map(flat, (blocks, starts, sizes))

    if not outer:
        blocks, starts, sizes = flat_lanes(())
        tiled = [_tiled_scatter(bm, plan.out_pads[o], plan.starts[n_in + o], blocks[o],
                                plan.out_init[o], lanes, grid)
                 for o, bm in enumerate(gm.out_block_mappings)]
        if all(t is not None for t in tiled):
            return tiled
        return _scatter(plan, list(plan.out_init), blocks, starts, sizes, n_inner)

    def outer_body(t, bufs):
        blocks, starts, sizes = flat_lanes(_unravel(t, outer_grid))
        return _scatter(plan, bufs, blocks, starts, sizes, n_inner)

    return lax.fori_loop(0, math.prod(outer_grid), outer_body, list(plan.out_init))


def _scatter(plan, bufs, blocks, starts, sizes, n_lanes):
    """Writes ``n_lanes`` lanes' output blocks at their (traced) starts."""
    gm = plan.gm
    outs = []
    for o, bm in enumerate(gm.out_block_mappings):

        def body(k, buf, o=o, bm=bm):
            st = [x[k] for x in starts[o]]
            sz = [None if not _is_bounded(d) else x[k] for d, x in zip(bm.block_dims, sizes[o])]
            return B.store_block(buf, bm, plan.out_pads[o], st, sz, blocks[o][k])

        outs.append(body(0, bufs[o]) if n_lanes == 1
                    else lax.fori_loop(0, n_lanes, body, bufs[o]))
    return outs


def _is_bounded(d) -> bool:
    return type(d).__name__ == "BoundedSlice"


def _tiled_scatter(bm, pads, start_table, lane_blocks, buf, lanes, grid):
    """When the lanes' blocks tile the padded buffer exactly, one transpose places them."""
    if start_table is None or not analysis.blocks_are_disjoint(bm) or any(
            lo for lo, _ in pads):
        return None
    shape = buf.shape
    bshape = bm.block_shape
    counts = [s // b if s % b == 0 else None for s, b in zip(shape, bshape)]
    if any(c is None for c in counts) or math.prod(counts) != len(lane_blocks):
        return None
    # The grid point that starts each lane (the sequential axes at zero), row-major.
    if not shape:
        return lane_blocks.reshape(()) if len(lane_blocks) == 1 else None
    rows = analysis.lane_rows(start_table, grid, lanes)
    expected = np.stack(np.unravel_index(np.arange(len(rows)), counts), axis=1)
    if not np.array_equal(rows // np.asarray(bshape), expected):
        return None
    x = lane_blocks.reshape(*counts, *bshape)
    nd = len(shape)
    perm = [p for i in range(nd) for p in (i, nd + i)]
    return x.transpose(perm).reshape(shape)


# ------------------------------------------------------------------------------------


def _own_schedule(args, jaxpr, gm, checks: Checks):
    """The outputs when a registered schedule runs the kernel itself, else None."""
    table = error_table_for(jaxpr, gm) if checks.any else None
    for schedule in interpret_schedules:
        res = schedule(list(args), jaxpr=jaxpr, grid_mapping=gm, checks=checks, errors=table)
        if res is not None:
            return res
    return None


def interpret_pallas_call(*args, jaxpr, grid_mapping, checks: Checks | None = None):
    """Runs the kernel on ``args`` with the reference semantics; returns the outputs.

    With checks on, the last output is the error vector (see :func:`decode_error`).
    """
    ensure_discovered()  # backends' interpreter rules for their own primitives
    gm = grid_mapping
    checks = Checks() if checks is None else checks
    nb = gm.num_dynamic_grid_bounds  # dynamic grid sizes come first
    grid = gm.runtime_grid([jnp.asarray(b, jnp.int32) for b in args[:nb]])
    plan = _Plan(gm, args[nb:], checks, grid)
    if checks.bounds:
        static_bounds_check(plan)
    err = jnp.zeros((error_vector_size(gm),), jnp.int32)
    own = None if plan.dynamic else _own_schedule(args, jaxpr, gm, checks)
    if own is not None:
        outs, own_err = own
        return [*outs, err if own_err is None else own_err] if checks.any else list(outs)
    if plan.dynamic:
        outs, seq_err = run_sequential(plan, jaxpr, checks)
        err = err if seq_err is None else seq_err
    elif gm.num_grid_points == 0:
        outs = list(plan.out_init)
    else:
        lanes = choose_lanes(plan, jaxpr, checks)
        if lanes is None:
            outs, seq_err = run_sequential(plan, jaxpr, checks)
            err = err if seq_err is None else seq_err
        else:
            outer = tuple(a for a in lanes if a in analysis.trip_count_axes(jaxpr))
            outs = run_lanes(plan, jaxpr, lanes, outer)
    outs = [
        B.unpad_array(x, pads, bm.array_aval.shape)
        for x, pads, bm in zip(outs, plan.out_pads, gm.out_block_mappings)
    ]
    return [*outs, err] if checks.any else outs
