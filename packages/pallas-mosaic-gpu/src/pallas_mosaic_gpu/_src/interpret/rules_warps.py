"""GPU interpret mode's rule for ``pl.core_map`` inside a kernel (``plgpu.WarpMesh``):
each point of the inner mesh (a warp) runs the body as its own cooperative task within
the enclosing thread, so one warp may wait on a barrier that another warp arrives on
(a TMA-issuing warp and an MMA-issuing warp, as upstream's Blackwell matmul has).

The warps share the warpgroup's vector-clock entry: the race detector sees them as one
thread (races between warps of one warpgroup are not reported)."""

from __future__ import annotations

import copy
import itertools

from pallas.plugins import core_map_p
from pallas_mosaic_gpu._src.interpret.evaluator import eval_jaxpr, register_gpu_rule
from pallas_mosaic_gpu._src.interpret.threads import Blocker


def _warp_view(th, coords: dict):
    """``th`` as seen by one point of an inner mesh: its coordinates added."""
    view = copy.copy(th)
    view.coords = {**th.coords, **coords}
    where = ", ".join(f"{n}={i}" for n, i in view.coords.items())
    view.name = f"thread ({where})"
    return view


@register_gpu_rule(core_map_p)
def _core_map(th, eqn, invals):
    p = eqn.params
    mesh = p["mesh"]
    names, sizes = tuple(mesh.shape), tuple(mesh.shape.values())
    tasks = []
    for point in itertools.product(*(range(s) for s in sizes)):
        view = _warp_view(th, dict(zip(names, point)))
        scratch = [th.launch.allocate(view, t, f"core_map scratch {i}", (id(eqn), i), ())
                   for i, t in enumerate(p["scratch_types"])]
        tasks.append([view.name, eval_jaxpr(view, p["jaxpr"], (), [*invals, *scratch]),
                      None])
    live = list(tasks)
    while live:
        progressed = False
        for task in list(live):
            blocker = task[2]
            if blocker is not None and not blocker.ready():
                continue
            progressed = True
            try:
                task[2] = next(task[1])
            except StopIteration:
                live.remove(task)
        if live and not progressed:
            waiting = [(name, b) for name, _, b in live]
            yield Blocker(lambda w=waiting: any(b.ready() for _, b in w),
                          "; ".join(f"{b.what} ({name})" for name, b in waiting))
    return []
