"""Static facts the interpreter uses to run grid points together without changing results.

Two facts decide which grid axes may be vectorised: which axes the output blocks depend
on (known exactly by evaluating the index maps over the whole grid at trace time), and
whether scratch buffers carry values into the first iteration of a lane (a
conservative write-before-read analysis of the kernel jaxpr).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.interpreter.blocks import block_indices_np
from pallas._src.jaxpr_util import eqn_sub_jaxprs
from pallas._src.primitives.grid import num_programs_p, program_id_p

# Index tables are kept *compact*: shape (*grid', outputs) where grid'[a] is grid[a] for
# the axes the index map reads and 1 for the others, so a table broadcasts against the
# whole grid and its size does not grow with axes it ignores (a grid of 10**9 programs
# with constant index maps has a one-row table). Past this many points a table is not
# built at all (None, as for an index map that reads scalar-prefetch data): the
# interpreter then evaluates index maps per grid point, in memory independent of the grid.
MAX_TABLE_POINTS = 1 << 21


def grid_coords(grid) -> list[np.ndarray]:
    """Per-axis coordinates of every grid point, in lexicographic (row-major) order."""
    n = math.prod(grid)
    if not grid:
        return []
    return [c.astype(np.int32) for c in np.unravel_index(np.arange(n), grid)]


def axes_read(jaxpr, n_axes: int) -> set[int]:
    """The grid axes (the first ``n_axes`` invars of ``jaxpr``) its outputs depend on;
    an equation with a nested jaxpr makes every output depend on every input."""
    deps: dict = {v: {a} for a, v in enumerate(jaxpr.invars[:n_axes])}
    for eqn in jaxpr.eqns:
        d = set().union(*(deps.get(v, set()) for v in eqn.invars if isinstance(v, jc.Var)))
        for v in eqn.outvars:
            deps[v] = d
    return set().union(*(deps.get(v, set()) for v in jaxpr.outvars if isinstance(v, jc.Var)))


def index_table(bm, grid) -> np.ndarray | None:
    """The index map's outputs over the grid, compact (see MAX_TABLE_POINTS): shape
    (*grid', outputs); None if they depend on scalar-prefetch data or the table is too
    large to build."""
    if bm.index_map_uses_prefetch:
        return None
    jaxpr = bm.index_map_jaxpr
    # The scalar-prefetch refs are unused: evaluate without them (binding a stand-in
    # would fail JAX's type checks under jax_enable_checks).
    extra = set(jaxpr.jaxpr.invars[len(grid):])
    used = [v for e in jaxpr.jaxpr.eqns for v in e.invars] + list(jaxpr.jaxpr.outvars)
    if any(isinstance(v, jc.Var) and v in extra for v in used):
        return None
    grid_only = jaxpr.jaxpr.replace(invars=jaxpr.jaxpr.invars[:len(grid)])
    n_out = len(jaxpr.jaxpr.outvars)
    if 0 in grid:
        return np.zeros((*grid, n_out), np.int64)
    read = axes_read(grid_only, len(grid))
    compact = tuple(g if a in read else 1 for a, g in enumerate(grid))
    n = math.prod(compact)
    if n > MAX_TABLE_POINTS:
        return None

    def f(*idx):
        return jax.core.eval_jaxpr(grid_only, jaxpr.consts, *idx)

    with jax.ensure_compile_time_eval():
        if n == 1:
            outs = f(*[np.int32(0)] * len(grid))
            return np.asarray([int(o) for o in outs], np.int64).reshape(*compact, n_out)
        outs = jax.vmap(f)(*grid_coords(compact))
        cols = [np.broadcast_to(np.asarray(o), (n,)) for o in outs]
    if not cols:
        return np.zeros((*compact, 0), np.int64)
    return np.stack(cols, axis=1).astype(np.int64).reshape(*compact, n_out)


def start_table(bm, table: np.ndarray) -> np.ndarray:
    """Element starts of a compact index table (same leading shape)."""
    rows = block_indices_np(bm, flat_rows(table))
    return rows.reshape(*table.shape[:-1], rows.shape[-1])


def flat_rows(table: np.ndarray) -> np.ndarray:
    """A compact table as (points, outputs), row-major (explicit sizes: a table may
    have no outputs)."""
    return table.reshape(math.prod(table.shape[:-1]), table.shape[-1])


def influencing_axes(table: np.ndarray, grid) -> set[int]:
    """The grid axes along which the (compact) table's rows change."""
    if table.shape[-1] == 0 or not grid:
        return set()
    return {a for a in range(len(grid))
            if table.shape[a] > 1 and np.any(np.diff(table, axis=a) != 0)}


def lane_rows(table: np.ndarray, grid, lanes) -> np.ndarray:
    """One row per point of the ``lanes`` axes (row-major), the other axes at 0."""
    sub = table[tuple(slice(None) if a in lanes else 0 for a in range(len(grid)))]
    return flat_rows(np.broadcast_to(sub, (*(grid[a] for a in sorted(lanes)), table.shape[-1])))


def rows_distinct(table: np.ndarray) -> bool:
    return len(np.unique(table, axis=0)) == table.shape[0]


def blocks_are_disjoint(bm) -> bool:
    """Whether distinct start rows of this mapping always mean disjoint blocks."""
    return all(isinstance(d, (bs.Blocked, bs.Squeezed)) for d in bm.block_dims)


# ------------------------------------------------------------------------------------
# Scratch liveness: is a scratch ref read before it is fully written?

_READS_ONLY = {"get", "masked_load", "semaphore_read"}


def _full_write(eqn, ref_aval) -> bool:
    """Whether a swap writes the whole ref (a plain ``ref[...] = x``)."""
    if eqn.primitive is not jc.swap_p:
        return False
    tree = eqn.params["tree"]
    idx_vals = eqn.invars[2:]
    try:
        transforms = jax.tree_util.tree_unflatten(
            tree, [v.val if isinstance(v, jc.Literal) else v for v in idx_vals]
        )
    except Exception:  # noqa: BLE001 - unknown layouts count as partial writes
        return False
    for t in transforms:
        if not isinstance(t, jc.NDIndexer):
            return False
        for idx, n in zip(t.indices, t.shape):
            if not isinstance(idx, jc.Slice):
                return False
            if not (isinstance(idx.start, int) and idx.start == 0 and idx.size == n
                    and idx.stride == 1):
                return False
    return True


class _Liveness:
    """Walks a jaxpr tracking which refs are fully written; finds reads before writes."""

    def __init__(self, known: dict):
        self.known = known  # Var -> concrete scalar value

    def value(self, v):
        if isinstance(v, jc.Literal):
            return v.val
        return self.known.get(v)

    def fold(self, eqn):
        """Evaluates scalar integer/bool equations whose inputs are all known."""
        if eqn.primitive.multiple_results or len(eqn.outvars) != 1:
            return
        vals = [self.value(v) for v in eqn.invars]
        if any(x is None for x in vals) or eqn.params.get("jaxpr") is not None:
            return
        if any(np.ndim(x) != 0 for x in vals):
            return
        try:
            with jax.ensure_compile_time_eval():
                out = eqn.primitive.bind(*vals, **eqn.params)
            self.known[eqn.outvars[0]] = np.asarray(out).item()
        except Exception:  # noqa: BLE001 - folding is best effort
            pass

    def walk(self, jaxpr, tracked: dict, written: set) -> bool:
        """Returns True if a tracked ref may be read before being fully written."""
        for eqn in jaxpr.eqns:
            refs = [tracked[v] for v in eqn.invars if isinstance(v, jc.Var) and v in tracked]
            p = eqn.primitive
            if p is jc.cond_p:
                idx = self.value(eqn.invars[0])
                branches = eqn.params["branches"]
                if idx is not None:
                    branches = [branches[int(np.clip(idx, 0, len(branches) - 1))]]
                results = []
                for br in branches:
                    sub = self._map(br.jaxpr, eqn.invars[1:], tracked)
                    w = set(written)
                    if self.walk(br.jaxpr, sub, w):
                        return True
                    results.append(w)
                written.clear()
                written.update(set.intersection(*results) if results else set())
                continue
            if p is jc.scan_p:
                sub = self._map(eqn.params["jaxpr"].jaxpr, eqn.invars, tracked)
                w = set(written)
                if self.walk(eqn.params["jaxpr"].jaxpr, sub, w):
                    return True
                if eqn.params["length"] > 0:
                    written.update(w)
                continue
            if p is jc.while_p:
                nc = eqn.params["cond_nconsts"]
                cj, bj = eqn.params["cond_jaxpr"].jaxpr, eqn.params["body_jaxpr"].jaxpr
                if self.walk(cj, self._map(cj, eqn.invars[:nc], tracked), set(written)):
                    return True
                if self.walk(bj, self._map(bj, eqn.invars[nc:], tracked), set(written)):
                    return True
                continue
            sub_jaxpr = _call_jaxpr(eqn)
            if sub_jaxpr is not None:
                if self.walk(sub_jaxpr, self._map(sub_jaxpr, eqn.invars, tracked), written):
                    return True
                continue
            if refs:
                if p is jc.swap_p and eqn.invars[0] in tracked:
                    if _full_write(eqn, eqn.invars[0].aval):
                        written.add(tracked[eqn.invars[0]])
                        continue
                    if tracked[eqn.invars[0]] in written:
                        continue
                    return True  # partial write of an unwritten ref: treat as a read
                if all(r in written for r in refs):
                    continue
                return True  # a read (or an unknown primitive) of an unwritten ref
            self.fold(eqn)
        return False

    @staticmethod
    def _map(sub_jaxpr, outer_vars, tracked) -> dict:
        """Maps the sub-jaxpr's leading invars to tracked refs of the outer operands."""
        out = {}
        for inner, outer in zip(sub_jaxpr.invars, outer_vars):
            if isinstance(outer, jc.Var) and outer in tracked:
                out[inner] = tracked[outer]
        return out


def writes_refs(kernel_jaxpr, indices) -> bool:
    """Whether the kernel may write (or accumulate into) one of its refs ``indices``, by
    the state effects of its jaxpr."""
    wanted = {kernel_jaxpr.invars[k] for k in indices}
    if not wanted:
        return False
    for e in kernel_jaxpr.effects:
        if isinstance(e, (jc.WriteEffect, jc.AccumEffect)):
            ref = kernel_jaxpr.invars[e.input] if isinstance(e.input, int) else e.input
            if ref in wanted:
                return True
    return False


def _call_jaxpr(eqn):
    for key in ("jaxpr", "call_jaxpr"):
        j = eqn.params.get(key)
        if j is not None:
            return getattr(j, "jaxpr", j)
    return None


def scratch_live_in(kernel_jaxpr, first_scratch: int, known_ids: dict[int, int],
                    grid) -> bool:
    """Whether some scratch ref may be read before it is fully written in one iteration.

    ``known_ids`` fixes some program ids (e.g. the sequential axes at the start of a
    lane), which lets ``pl.when(pl.program_id(k) == 0)`` initialisation count as a
    write.
    """
    jaxpr = kernel_jaxpr.jaxpr if hasattr(kernel_jaxpr, "jaxpr") else kernel_jaxpr
    return _refs_live_in(jaxpr, jaxpr.invars[first_scratch:], known_ids, grid)


def ref_live_in(kernel_jaxpr, index: int, known_ids: dict[int, int], grid) -> bool:
    """Whether the kernel's ref ``index`` (any operand or scratch ref) may be read before
    it is fully written in one iteration: its value then comes from an earlier one."""
    jaxpr = kernel_jaxpr.jaxpr if hasattr(kernel_jaxpr, "jaxpr") else kernel_jaxpr
    return _refs_live_in(jaxpr, [jaxpr.invars[index]], known_ids, grid)


def _refs_live_in(jaxpr, refs, known_ids, grid) -> bool:
    tracked = {v: i for i, v in enumerate(refs)}
    if not tracked:
        return False
    known: dict = {}
    live = _Liveness(known)
    orig_fold = live.fold

    def fold(eqn):
        if eqn.primitive is program_id_p and eqn.params["axis"] in known_ids:
            known[eqn.outvars[0]] = known_ids[eqn.params["axis"]]
        elif eqn.primitive is num_programs_p:
            known[eqn.outvars[0]] = grid[eqn.params["axis"]]
        else:
            orig_fold(eqn)

    live.fold = fold
    return live.walk(jaxpr, tracked, set())


# ------------------------------------------------------------------------------------
# Which program ids set the trip count of a loop?


def trip_count_axes(kernel_jaxpr) -> set[int]:
    """Grid axes whose ``program_id`` flows into the inputs of a ``while`` loop.

    Vectorising such an axis runs every lane for the longest trip (a causal attention
    kernel would do twice the work), so the interpreter loops over it instead.
    """
    axes: set[int] = set()

    def walk(jaxpr, taint: dict):
        for eqn in jaxpr.eqns:
            ins = set()
            for v in eqn.invars:
                if isinstance(v, jc.Var):
                    ins |= taint.get(v, set())
            if eqn.primitive is program_id_p:
                ins = {eqn.params["axis"]}
            if eqn.primitive is jc.while_p:
                axes.update(ins)
            for sub in eqn_sub_jaxprs(eqn):
                inner = {iv: set(ins) for iv in sub.invars}
                walk(sub, inner)
            for o in eqn.outvars:
                taint[o] = ins

    j = kernel_jaxpr.jaxpr if hasattr(kernel_jaxpr, "jaxpr") else kernel_jaxpr
    walk(j, {})
    return axes
