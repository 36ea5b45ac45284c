"""``pl.core_map(plgpu.WarpMesh(...))`` inside a kernel: code run by each warp of the
warpgroup on its own (a TMA-issuing warp and an MMA-issuing warp, as upstream's
Blackwell matmul has).

The warpgroup's 128 threads all enter the body; ``lax.axis_index`` of the mesh's axis is
the thread's warp index (0..3), uniform within a warp, so ``pl.when`` on it gives each
warp its own branch. Inside, the lowering is in *warp scope* (``lctx.scope``): an
operation one thread issues (a TMA copy, a barrier arrival, ``tcgen05_mma``, a commit)
is issued by one thread of the warp rather than of the warpgroup
(:func:`threads.scope_issuer`), and nothing synchronises the warpgroup
(:func:`threads.scope_sync`), since the other warps run other code.
Arrays (held across a warpgroup's threads) are not available in warp scope. After the
body the warpgroup synchronises, so what a warp wrote to SMEM is seen by all of it.
"""

from __future__ import annotations

from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir.dialects import arith

from pallas import plugins
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import lower_jaxpr, rule
from pallas_mosaic_gpu._src.mesh import WarpMesh

WARPS = WarpMesh.NUM_WARPS_PER_WARPGROUP


@rule(plugins.core_map_p)
def _core_map(lctx, eqn, *consts):
    p = eqn.params
    mesh = p["mesh"]
    if not isinstance(mesh, WarpMesh):
        raise NotImplementedError(
            f"pl.core_map over a {type(mesh).__name__} inside a kernel (only "
            "plgpu.WarpMesh is lowered there)")
    if lctx.scope == "warp":
        raise NotImplementedError("pl.core_map over a plgpu.WarpMesh inside another one")
    if p["scratch_types"]:
        raise NotImplementedError("scratch_shapes of a pl.core_map over a plgpu.WarpMesh")
    warp = arith.remui(mgpu.warp_idx(sync=True), V.const(WARPS, V.i32()))
    saved = dict(lctx.inner_axes)
    lctx.scope, lctx.inner_axes[mesh.axis_name] = "warp", warp
    try:
        lower_jaxpr(lctx, p["jaxpr"], [], list(consts))
    finally:
        lctx.scope, lctx.inner_axes = "warpgroup", saved
    mgpu.warpgroup_barrier()  # every warp is done before the warpgroup goes on
    return []
