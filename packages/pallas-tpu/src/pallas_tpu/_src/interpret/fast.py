"""The compiled path of TPU interpret mode, for kernel bodies that only compute locally.

A body that touches only its core's own buffers (block buffers, VMEM/SMEM scratch,
scalar prefetch), with statically indexed ref accesses and no DMAs, semaphores,
barriers, scoped allocations or side effects, cannot race with anything and cannot
index out of bounds at run time. Such a body is compiled once, as a function from the
buffers' contents and the grid point to their new contents (evaluated by the core
interpreter with the TPU rules), and each grid point is one call of it. The simulation
around it (block copies between HBM and VMEM, cores, race detection on HBM) is unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas.plugins import Cell, KernelContext, eval_jaxpr, load_p, swap_p
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.interpret import scalars
from pallas_tpu._src.interpret.evaluator import CF, _sub_jaxprs

# Ref primitives allowed in a compiled body, with the number of value operands between
# the ref and its indexer leaves.
_REF_PRIMS = {jc.get_p: 0, jc.swap_p: 1, jc.addupdate_p: 1, load_p: 0, swap_p: 1}
_CONTROL = set(CF.values())
_cache: dict = {}  # keys hold the jaxprs and grid mappings themselves, never their id()


def _is_ref(v) -> bool:
    return isinstance(getattr(v, "aval", None), jc.AbstractRef)


def _local(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        prim = eqn.primitive
        refs = [v for v in eqn.invars if _is_ref(v)]
        if prim in _REF_PRIMS:
            n_val = _REF_PRIMS[prim]
            leaves = eqn.invars[1 + n_val:1 + n_val + eqn.params["tree"].num_leaves]
            if any(not isinstance(v, jc.Literal) for v in leaves):
                return False  # a dynamic index: checked at run time by the simulation
            continue
        if prim in _CONTROL:
            if not all(_local(j) for j in _sub_jaxprs(eqn)):
                return False
            continue
        if refs or any(_is_ref(v) for v in eqn.outvars):
            return False  # DMAs, semaphores, views, allocations: the simulation's job
        if any(True for _ in _sub_jaxprs(eqn)):
            return False
        if any(not isinstance(e, jc.effects.JaxprInputEffect) for e in eqn.effects):
            return False  # prints, callbacks: run in order by the simulation
    return True


def compiled_body(closed, grid, names, params):
    """A jitted ``step(point, *values) -> new values`` for ``closed`` (the kernel body),
    or None when the body needs the simulation (see the module docstring)."""
    if params.skip_floating_point_ops:
        return None
    key = (closed, tuple(grid), names)
    hit = _cache.get(key)
    if hit is not None:
        return hit[1]
    step = None
    if _local(closed.jaxpr):
        def run(point, *values):
            cells = [Cell(v, f"kernel operand {i}") for i, v in enumerate(values)]
            ctx = KernelContext(tuple(point[d] for d in range(len(grid))), tuple(grid),
                                axis_names=names)
            eval_jaxpr(ctx, closed.jaxpr, closed.consts, cells)
            # Only the operands the body writes come back (an operand it only reads
            # keeps its input tracer): no copy back of unchanged input blocks.
            written = tuple(i for i, (c, v) in enumerate(zip(cells, values))
                            if c.value is not v)
            step.written = written  # a property of the body: the same at every trace
            return [cells[i].value for i in written]

        step = _Step(jax.jit(run))
    _cache[key] = (closed, step)
    return step


class _Step:
    """A compiled body, and the indices of the operands it writes (its outputs), known
    once it has been traced."""

    def __init__(self, fn):
        self.fn = fn
        self.written: tuple = ()

    def __call__(self, point, *values):
        outs = self.fn(point, *values)
        return self.written, outs


_NONE = np.zeros((0,), np.int8)


def usable(buffers, num_cores: int) -> bool:
    """Whether a compiled body may run on ``buffers``: each is HBM (never accessed by a
    local body), private to its core, or the device has a single core."""
    return num_cores == 1 or all(_hbm(b) or (isinstance(b.key, tuple) and len(b.key) > 3
                                             and b.key[3] is not None) for b in buffers)


def _hbm(buf) -> bool:
    return getattr(buf.memory_space, "name", "") in ("ANY", "HBM")


def run_point(step, point, buffers) -> None:
    """One grid point of a compiled body: reads the buffers, writes their new contents
    (HBM buffers, which a local body cannot touch, are passed as placeholders)."""
    values = [_NONE if _hbm(b) else b.value for b in buffers]
    written, outs = step(np.asarray(point, np.int32), *values)
    for i, new in zip(written, outs):
        if not _hbm(buffers[i]):
            buffers[i].value = np.asarray(new)


def scalar_index_maps(gm, skip: tuple):
    """``f(point) -> [indices of each block mapping]`` evaluated in Python (see
    :mod:`.scalars`), or None when an index map reads scalar prefetch or does more than
    scalar integer arithmetic."""
    key = ("scalar_index_maps", gm, skip)
    hit = _cache.get(key)
    if hit is not None:
        return hit[1]
    nd = len(gm.grid)
    runs = []
    for bm, s in zip(gm.block_mappings, skip):
        if s:
            runs.append(None)
            continue
        j = bm.index_map_jaxpr.jaxpr
        run = None
        if not bm.index_map_jaxpr.consts and not j.constvars:
            run = scalars.plan(j.eqns, j.invars[:nd], j.outvars)
        if run is None:
            _cache[key] = (gm, None)
            return None
        runs.append(run)

    def f(point):
        return [_NONE if r is None else r(*point) for r in runs]

    _cache[key] = (gm, f)
    return f


def compiled_index_maps(gm, skip: tuple):
    """A jitted ``f(point, *prefetch) -> [indices of each block mapping]`` (empty where
    ``skip``: HBM operands have no blocks), so a grid point costs one call for all."""
    hit = _cache.get(("index_maps", gm, skip))
    if hit is not None:
        return hit[1]
    bms = list(gm.block_mappings)
    hbm = skip

    def run(point, *prefetch):
        ctx = KernelContext(tuple(point[d] for d in range(len(gm.grid))), tuple(gm.grid))
        cells = [Cell(v, f"scalar prefetch {i}") for i, v in enumerate(prefetch)]
        outs = []
        for bm, skip in zip(bms, hbm):
            if skip:
                outs.append(jnp.zeros((0,), jnp.int32))
                continue
            m = bm.index_map_jaxpr
            idx = eval_jaxpr(ctx, m.jaxpr, m.consts,
                             [point[d] for d in range(len(gm.grid))] + cells)
            outs.append(jnp.stack([jnp.asarray(i, jnp.int32) for i in idx])
                        if idx else jnp.zeros((0,), jnp.int32))
        return outs

    fn = jax.jit(run)
    _cache[("index_maps", gm, skip)] = (gm, fn)
    return fn
