"""GPU-interpret-mode rules of the hint primitives (no-ops), layout casts (identity)
and the TMEM copies (logged like any access)."""

from __future__ import annotations

from pallas_mosaic_gpu._src.interpret.evaluator import register_gpu_rule
from pallas_mosaic_gpu._src.interpret.rules_core import read, write
from pallas_mosaic_gpu._src.interpret.sync import barrier_of, tensor_core_arrive
from pallas_mosaic_gpu._src.layouts import layout_cast_p
from pallas_mosaic_gpu._src.primitives import hints, tmem
from pallas_mosaic_gpu._src.primitives import refs as R


@register_gpu_rule(*hints.HINTS)
def _hint(th, eqn, invals):
    return []


@register_gpu_rule(layout_cast_p)
def _layout_cast(th, eqn, invals):
    return [invals[0]]


@register_gpu_rule(tmem.copy_smem_to_tmem_p)
def _smem_to_tmem(th, eqn, invals):
    src, dst = R.unflatten(eqn.params["refs"], invals)
    write(th, *dst, read(th, *src))
    return []


@register_gpu_rule(tmem.tcgen05_commit_arrive_p)
def _commit_arrive(th, eqn, invals):
    R.check_not_collective(eqn, "tcgen05_commit_arrive")
    tensor_core_arrive(th, barrier_of(th, eqn.params["refs"], invals))
    return []
