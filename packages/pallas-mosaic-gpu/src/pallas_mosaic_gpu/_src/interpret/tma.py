"""TMA copies in GPU interpret mode.

A copy runs on a simulated TMA unit (``InterpretParams.num_tma_threads_per_device`` of
them, taken round robin), which has its own vector-clock entry: the unit starts after
everything the issuing thread did (a fork of its clock), reads the source and writes
the destination at its own time, then arrives on the copy's barrier (GMEM->SMEM) or
joins the issuing thread's bulk group (SMEM->GMEM). A thread that reads the data before
waiting on the barrier (or ``wait_smem_to_gmem``) is therefore racing with the copy.
The data moves when the copy is issued.
"""

from __future__ import annotations

import jax

from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.interpret import pairs
from pallas_mosaic_gpu._src.interpret.devices import resolve, resolve_all
from pallas_mosaic_gpu._src.interpret.evaluator import no_effect, register_gpu_rule
from pallas_mosaic_gpu._src.interpret.memory import (
    access_region,
    clipped_get,
    clipped_region,
    clipped_set,
    describe_region,
    get_view,
    set_view,
)
from pallas_mosaic_gpu._src.interpret.sync import arrive, barrier_of, peer_barrier
from pallas_mosaic_gpu._src.primitives import cluster_store
from pallas_mosaic_gpu._src.primitives import copies as C
from pallas_mosaic_gpu._src.primitives import refs as R


def _start_unit(th) -> int | None:
    launch = th.launch
    if launch.clocks is None:
        return None
    unit = launch.tma_unit()
    launch.clocks.fork(th.entry, unit)
    return unit


def _checked_region(th, buf, flat, tree, what):
    region, ok = access_region(buf.shape, flat, tree)
    if not ok:
        raise IndexError(f"GPU interpret mode: TMA copy {what} {buf.name} (shape "
                         f"{buf.shape}) out of bounds at {describe_region(region)}, by "
                         f"{th.name} at {th.site}")
    return region


def _copy(th, src, dst, unit, combine=None, gmem="src"):
    """A TMA copy. Its GMEM box (``gmem``: "src" or "dst") may overhang the array, as
    the hardware allows: a load reads zeros there, a store drops those elements. The
    SMEM side must lie in bounds."""
    sbuf, sflat, stree = resolve(th, *src, "a TMA copy's source")
    dbuf, dflat, dtree = resolve(th, *dst, "a TMA copy's destination")
    if gmem == "src":
        sreg = clipped_region(sbuf.shape, sflat, stree)
        dreg = _checked_region(th, dbuf, dflat, dtree, "destination")
        data = clipped_get(sbuf, sflat, stree)
    else:
        sreg = _checked_region(th, sbuf, sflat, stree, "source")
        dreg = clipped_region(dbuf.shape, dflat, dtree)
        data = get_view(sbuf, sflat, stree)
    if combine is not None:
        data = combine(clipped_get(dbuf, dflat, dtree), data)
    if sreg is not None:
        th.access(sbuf, "read", sreg, unit=unit)
    if dreg is not None:
        th.access(dbuf, "write", dreg, unit=unit)
    dbuf.value = clipped_set(dbuf, data, dflat, dtree) if gmem == "dst" else \
        set_view(dbuf, data, dflat, dtree)


@register_gpu_rule(C.copy_gmem_to_smem_p)
def _gmem_to_smem(th, eqn, invals):
    p = eqn.params
    src, dst, bar = R.unflatten(p["refs"], invals)
    if p["leader_tracked"] is not None:
        _leader_tracked(th, p, src, dst, bar)
        return []
    # A multicast copy (collective_axes) is issued alike by every block of the cluster
    # along those axes, and each block's SMEM receives the whole source: each block's
    # copy is simulated as landing in its own buffer and arriving on its own barrier.
    unit = _start_unit(th)
    _copy(th, src, dst, unit)
    state = barrier_of(th, p["refs"][2:], invals)
    arrive(state, None if unit is None else th.launch.clocks.release(unit))
    return []


def _part(view, axis: int, index: int, size: int):
    """``view`` narrowed to its ``index``-th of equal parts along ``axis``."""
    buf, flat, tree = view
    transforms = list(jax.tree_util.tree_unflatten(tree, flat)) if tree is not None else []
    shape = jc.transform_type(transforms, jax.typeof(buf.value)).shape
    n = shape[axis] // size
    idx = tuple(jc.Slice(index * n, n) if d == axis else slice(None)
                for d in range(len(shape)))
    transforms.append(jc.NDIndexer.from_indices_shape(idx, shape))
    flat, tree = jax.tree_util.tree_flatten(transforms)
    return buf, flat, tree


def _leader_tracked(th, p, src, dst, bar) -> None:
    """``copy_gmem_to_smem(leader_tracked=...)``: every block of the cluster along the
    (one) collective axis loads into its own ``dst``: its part of ``src`` along the
    partition axis (``PARTITIONED(axis)``) or all of it (``REPLICATED``). Only the
    leader's barrier tracks the copy: it gets one arrival once every block has issued
    its part (all the bytes have landed)."""
    (axis,) = p["collective_axes"]
    what = f"plgpu.copy_gmem_to_smem(leader_tracked={p['leader_tracked']})"
    index, size = pairs.rank(th, axis, what)
    part = getattr(p["leader_tracked"], "axis", None)
    if part is not None:
        src = _part(src, part, index, size)
    unit = _start_unit(th)
    _copy(th, src, dst, unit)
    state = peer_barrier(th, bar, axis, 0)
    state.tracked_arrive(index, size, None if unit is None else th.launch.clocks.release(unit))


@register_gpu_rule(C.copy_smem_to_gmem_p)
def _smem_to_gmem(th, eqn, invals):
    p = eqn.params
    src, dst = R.unflatten(p["refs"], invals)
    if p["has_predicate"] and not bool(invals[R.spec_end(p["refs"])]):
        return []
    unit = _start_unit(th)
    op = p["reduction_op"]
    # Through a plgpu.multicast_ref: the store reaches every device along its axes.
    for target in resolve_all(th, *dst, "a TMA copy's destination"):
        _copy(th, src, target, unit,
              None if op is None else (lambda o, n: C.reduce(op, o, n)), gmem="dst")
    th.open_group.append(None if unit is None else th.launch.clocks.release(unit))
    if p["commit_group"]:
        _commit_group(th)
    return []


def _commit_group(th) -> None:
    th.store_groups.append(th.open_group)
    th.open_group = []


@register_gpu_rule(C.commit_group_p)
def _commit_group_rule(th, eqn, invals):
    _commit_group(th)
    return []


@register_gpu_rule(C.wait_smem_to_gmem_p)
def _wait_smem_to_gmem(th, eqn, invals):
    n = eqn.params["n"]
    done = th.store_groups[:max(len(th.store_groups) - n, 0)]
    th.store_groups = th.store_groups[len(done):]
    for group in done:
        for clock in group:
            th.acquire(clock)
    return []


# A TMA unit starts after all its issuing thread did: commit_smem has nothing to order.
register_gpu_rule(C.commit_smem_p)(no_effect)


@register_gpu_rule(cluster_store.async_store_smem_p)
def _async_store_smem(th, eqn, invals):
    """``async_store_smem``: an asynchronous unit (like a TMA copy's) writes ``src`` into
    the ``ref`` of the block at ``cluster_idx`` along ``cluster_dim`` (combining with
    ``atomic``) and arrives once on that block's barrier."""
    p = eqn.params
    spec = p["refs"]
    ref, bar = R.unflatten(spec, invals)
    src, index = invals[0], int(invals[R.spec_end(spec)])
    axis, what = p["cluster_dim"], "plgpu.async_store_smem"
    _, size = pairs.rank(th, axis, what)
    if not 0 <= index < size:
        raise ValueError(f"{what}: cluster_idx={index} is out of range for the "
                         f"{size} blocks along the cluster axis {axis!r}")
    buf, flat, tree = pairs.peer_view(th, ref, axis, index)
    region = _checked_region(th, buf, flat, tree, "destination")
    unit = _start_unit(th)
    new = src
    if p["atomic"] is not None:
        th.access(buf, "read", region, unit=unit)
        new = C.reduce(p["atomic"], get_view(buf, flat, tree), src)
    th.access(buf, "write", region, unit=unit)
    buf.value = set_view(buf, new, flat, tree)
    arrive(peer_barrier(th, bar, axis, index),
           None if unit is None else th.launch.clocks.release(unit))
    return []
