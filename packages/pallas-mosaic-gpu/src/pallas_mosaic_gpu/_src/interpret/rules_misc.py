"""GPU-interpret-mode rules of the hint primitives (no-ops), layout casts (identity)
and the TMEM copies (logged like any access).

With ``collective_axis`` (a CTA pair), ``async_copy_*_to_tmem`` and
``tcgen05_commit_arrive`` are issued by the leader block (the follower's issue does
nothing, as upstream's lowering predicates them): the copy moves each block's SMEM into
its own TMEM, the commit arrives on the barrier at the same offset in both blocks."""

from __future__ import annotations

from pallas_mosaic_gpu._src.interpret import pairs
from pallas_mosaic_gpu._src.interpret.access import read, write
from pallas_mosaic_gpu._src.interpret.evaluator import no_effect, register_gpu_rule
from pallas_mosaic_gpu._src.interpret.sync import barrier_of, peer_barrier, tensor_core_arrive
from pallas_mosaic_gpu._src.layouts import layout_cast_p
from pallas_mosaic_gpu._src.primitives import hints, tmem
from pallas_mosaic_gpu._src.primitives import refs as R

register_gpu_rule(*hints.HINTS)(no_effect)


@register_gpu_rule(layout_cast_p)
def _layout_cast(th, eqn, invals):
    return [invals[0]]


def _pair_blocks(th, eqn, fn: str) -> tuple[int, ...]:
    """The blocks a CTA pair's operation reaches: both when issued by the leader, none
    when issued by the follower."""
    axis = eqn.params["collective_axis"]
    what = f"plgpu.{fn}(collective_axis={axis!r})"
    return (0, 1) if pairs.check_pair(th, axis, what) == 0 else ()


@register_gpu_rule(tmem.copy_smem_to_tmem_p)
def _smem_to_tmem(th, eqn, invals):
    src, dst = R.unflatten(eqn.params["refs"], invals)
    axis = eqn.params["collective_axis"]
    kind = eqn.params["kind"]
    if axis is None:
        write(th, *dst, tmem.copied_value(kind, read(th, *src)))
        return []
    for j in _pair_blocks(th, eqn, f"async_copy_{kind}_to_tmem"):
        write(th, *pairs.peer_view(th, dst, axis, j),
              tmem.copied_value(kind, read(th, *pairs.peer_view(th, src, axis, j))))
    return []


@register_gpu_rule(tmem.tcgen05_commit_arrive_p)
def _commit_arrive(th, eqn, invals):
    spec = eqn.params["refs"]
    axis = eqn.params["collective_axis"]
    if axis is None:
        tensor_core_arrive(th, barrier_of(th, spec, invals))
        return []
    (bar,) = R.unflatten(spec, invals)[:1]
    blocks = _pair_blocks(th, eqn, "tcgen05_commit_arrive")
    if blocks:
        tensor_core_arrive(th, *(peer_barrier(th, bar, axis, j) for j in blocks))
    return []
