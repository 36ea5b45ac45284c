"""TMA copies between GMEM and SMEM, and the fences and waits around them.

``copy_gmem_to_smem(src, dst, barrier)`` starts an asynchronous copy that arrives on
``barrier`` when the data has landed; ``copy_smem_to_gmem(src, dst)`` starts a store
that joins the current *bulk group* (closed by ``commit_group=True``, the default, or
``commit_smem_to_gmem_group()``); ``wait_smem_to_gmem(n)`` waits until at most ``n``
groups are in flight. ``commit_smem()`` orders the thread's SMEM writes before later
TMA reads of them.

Reference interpreter: copies happen when issued (a correct kernel cannot tell), the
copy into SMEM counts one arrival on its barrier. GPU interpret mode runs them on
simulated TMA units and checks the ordering (``interpret/copies.py``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

# Enums of the Mosaic GPU compiler library that the kernel language passes through.
from jax.experimental.mosaic.gpu.launch_context import CopyPartition, OOBFillMode

from pallas.plugins import effect_primitive
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.memory import GMEM, SMEM, BarrierSpace
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.barriers import check_barrier

TMA_REDUCTIONS = ("add", "min", "max", "inc", "dec", "and", "or", "xor")


def _gmem_to_smem_effects(*avals, refs, **_):
    src, dst, bar = refs
    return {jc.ReadEffect(src[0]), jc.WriteEffect(dst[0]), jc.WriteEffect(bar[0])}


def _smem_to_gmem_effects(*avals, refs, **_):
    src, dst = refs
    return {jc.ReadEffect(src[0]), jc.WriteEffect(dst[0])}


copy_gmem_to_smem_p = effect_primitive("mgpu_copy_gmem_to_smem", _gmem_to_smem_effects)
copy_smem_to_gmem_p = effect_primitive("mgpu_copy_smem_to_gmem", _smem_to_gmem_effects)
commit_smem_p = effect_primitive("mgpu_commit_smem", {jc.gpu_effect})
commit_group_p = effect_primitive("mgpu_commit_smem_to_gmem_group", {jc.gpu_effect})
wait_smem_to_gmem_p = effect_primitive("mgpu_wait_smem_to_gmem", {jc.gpu_effect})


def _check_space(ref: Any, want, fn: str, what: str) -> None:
    space = R.memory_space(ref)
    if space is not None and space is not want and hasattr(space, "name") and space in (
            GMEM, SMEM):
        raise TypeError(f"plgpu.{fn}: {what} must be in {want.name}, got {space.name}")


def _check_pair(src: Any, dst: Any, fn: str) -> None:
    s, d = R.view_aval(src), R.view_aval(dst)
    if tuple(s.shape) != tuple(d.shape) or s.dtype != d.dtype:
        raise ValueError(
            f"plgpu.{fn}: src is {s.str_short()} but dst is {d.str_short()}; a TMA copy "
            "needs the same shape and dtype on both sides")


def _axes(collective_axes) -> tuple:
    if collective_axes is None:
        return ()
    return (collective_axes,) if isinstance(collective_axes, str) else tuple(collective_axes)


def _check_partitioned(src: Any, dst: Any, axis: int) -> None:
    """A partitioned copy's ``src`` is the whole window of the CTA pair: ``dst``'s shape
    but along ``axis``, where it holds the blocks' parts one after another."""
    s, d = R.view_aval(src), R.view_aval(dst)
    ok = (len(s.shape) == len(d.shape) and 0 <= axis < len(d.shape) and s.dtype == d.dtype
          and all(a == b for i, (a, b) in enumerate(zip(s.shape, d.shape)) if i != axis)
          and d.shape[axis] and s.shape[axis] % d.shape[axis] == 0)
    if not ok:
        raise ValueError(
            f"plgpu.copy_gmem_to_smem(leader_tracked=CopyPartition.PARTITIONED({axis})): "
            f"src is {s.str_short()} and dst is {d.str_short()}; src must be dst's shape "
            f"and dtype but along axis {axis}, where it is the cluster's blocks' dst "
            "windows together (dst's size times the blocks along collective_axes)")


def _check_leader_tracked(leader_tracked: Any, collective_axes: Any) -> None:
    """Trace-time errors for ``copy_gmem_to_smem(leader_tracked=...)``: it takes a
    ``plgpu.CopyPartition`` and needs the cluster axis (``collective_axes``) it splits
    the copy across."""
    if not isinstance(leader_tracked, CopyPartition):
        raise TypeError(
            f"plgpu.copy_gmem_to_smem(leader_tracked={leader_tracked!r}): expected "
            "plgpu.CopyPartition.PARTITIONED(axis) or plgpu.CopyPartition.REPLICATED")
    if len(_axes(collective_axes)) != 1:
        raise ValueError(
            f"plgpu.copy_gmem_to_smem(leader_tracked={leader_tracked}): needs "
            "collective_axes= naming exactly one cluster axis (the CTA pair the copy is "
            f"split across), got collective_axes={collective_axes!r}")


def copy_gmem_to_smem(src: Any, dst: Any, barrier: Any, *,
                      collective_axes: str | tuple[str, ...] | None = None,
                      leader_tracked: Any = None,
                      oob_mode: OOBFillMode = OOBFillMode.ZEROS) -> None:
    """Starts an asynchronous TMA copy of ``src`` (GMEM) into ``dst`` (SMEM) that
    arrives on ``barrier`` when done; with ``collective_axes`` the copy is multicast to
    the SMEM of every block of the cluster along those axes."""
    _check_space(src, GMEM, "copy_gmem_to_smem", "src")
    _check_space(dst, SMEM, "copy_gmem_to_smem", "dst")
    if leader_tracked is not None:
        _check_leader_tracked(leader_tracked, collective_axes)
    part = getattr(leader_tracked, "axis", None)
    if part is not None:
        _check_partitioned(src, dst, part)
    else:
        _check_pair(src, dst, "copy_gmem_to_smem")
    space = check_barrier(barrier, "copy_gmem_to_smem")
    refs = R.FlatRefs(src, dst, barrier)
    copy_gmem_to_smem_p.bind(*refs.operands, refs=refs.spec, barrier_space=space,
                             collective_axes=_axes(collective_axes),
                             leader_tracked=leader_tracked, oob_mode=OOBFillMode(oob_mode))


def copy_smem_to_gmem(src: Any, dst: Any, predicate: jax.Array | None = None, *,
                      commit_group: bool = True, reduction_op: Any = None) -> None:
    """Starts an asynchronous TMA store of ``src`` (SMEM) into ``dst`` (GMEM); with
    ``reduction_op`` (``"add"``, ``"max"``, ...) it combines into ``dst`` instead.
    ``predicate`` (a bool scalar) skips the copy when false."""
    _check_space(src, SMEM, "copy_smem_to_gmem", "src")
    _check_space(dst, GMEM, "copy_smem_to_gmem", "dst")
    _check_pair(src, dst, "copy_smem_to_gmem")
    op = None if reduction_op is None else str(getattr(reduction_op, "value", reduction_op))
    op = op.lower() if op is not None else None
    if op is not None and op not in TMA_REDUCTIONS:
        raise ValueError(f"plgpu.copy_smem_to_gmem(reduction_op={reduction_op!r}): must be "
                         f"one of {TMA_REDUCTIONS}")
    refs = R.FlatRefs(src, dst)
    pred = [] if predicate is None else [jnp.asarray(predicate, jnp.bool_)]
    copy_smem_to_gmem_p.bind(*refs.operands, *pred, refs=refs.spec,
                             has_predicate=predicate is not None,
                             commit_group=bool(commit_group), reduction_op=op)


def commit_smem() -> None:
    """Makes this thread's SMEM writes visible to the TMA engine (a fence)."""
    commit_smem_p.bind()


def commit_smem_to_gmem_group() -> None:
    """Closes the current bulk group of SMEM->GMEM copies."""
    commit_group_p.bind()


def wait_smem_to_gmem(n: int, wait_read_only: bool = False) -> None:
    """Waits until at most ``n`` bulk groups of SMEM->GMEM copies are in flight
    (``wait_read_only``: only until their SMEM reads are done)."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"plgpu.wait_smem_to_gmem(n={n!r}): n must be an int >= 0")
    wait_smem_to_gmem_p.bind(n=n, wait_read_only=bool(wait_read_only))


def reduce(op: str | None, old, new):
    """``new`` combined into ``old`` by a TMA reduction (``None``: plain store)."""
    if op is None:
        return new
    fns = {"add": jnp.add, "min": jnp.minimum, "max": jnp.maximum, "and": jnp.bitwise_and,
           "or": jnp.bitwise_or, "xor": jnp.bitwise_xor,
           "inc": lambda o, n: jnp.where(o >= n, 0, o + 1).astype(o.dtype),
           "dec": lambda o, n: jnp.where((o == 0) | (o > n), n, o - 1).astype(o.dtype)}
    return fns[op](old, new)


# -- reference interpreter rules ---------------------------------------------------------


def _view(cell, flat, tree):
    return jc.get_view(cell.value, flat, tree)


def _set(cell, flat, tree, new):
    cell.value = jc.set_view(cell.value, new, flat, tree)
    if getattr(cell, "init", None) is not None:
        cell.init = jc.set_view(cell.init, jnp.ones(jnp.shape(new), jnp.bool_), flat, tree)


def gmem_to_smem_rule(ctx, eqn, invals):
    R.check_not_collective(eqn, "copy_gmem_to_smem")
    src, dst, (bar, bflat, btree) = R.unflatten(eqn.params["refs"], invals)
    _set(*dst, _view(*src))
    count = jc.get_view(bar.value, bflat, btree)
    bar.value = jc.set_view(bar.value, count + 1, bflat, btree)
    return []


def smem_to_gmem_rule(ctx, eqn, invals):
    p = eqn.params
    src, dst = R.unflatten(p["refs"], invals)
    new = reduce(p["reduction_op"], _view(*dst), _view(*src))
    if p["has_predicate"]:
        new = jnp.where(invals[R.spec_end(p["refs"])], new, _view(*dst))
    _set(*dst, new)
    return []


INTERPRET_RULES = {
    copy_gmem_to_smem_p: gmem_to_smem_rule,
    copy_smem_to_gmem_p: smem_to_gmem_rule,
    commit_smem_p: lambda ctx, eqn, invals: [],
    commit_group_p: lambda ctx, eqn, invals: [],
    wait_smem_to_gmem_p: lambda ctx, eqn, invals: [],
}

__all__ = ["BarrierSpace", "CopyPartition", "OOBFillMode"]
