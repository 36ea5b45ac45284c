"""Lowering rules of the kernel's threads: ``lax.axis_index`` (of a grid, cluster or thread
axis of the kernel's mesh, of a ``plgpu.WarpMesh`` axis, or of the enclosing
``shard_map``'s device mesh) and ``plgpu.set_max_registers``. See :mod:`threads`.
"""

from __future__ import annotations

from jaxlib.mlir.dialects import nvvm

from pallas import plugins
from pallas_mosaic_gpu._src.lowering.collectives import mesh_axis_index
from pallas_mosaic_gpu._src.lowering.engine import rule
from pallas_mosaic_gpu._src.primitives.hints import set_max_registers_p


@rule(plugins.axis_index_p)
def _axis_index(lctx, eqn):
    name = eqn.params["axis_name"]
    names = lctx.axis_names
    if isinstance(name, tuple) and len(name) == 1:
        name = name[0]
    if name in lctx.inner_axes:  # a plgpu.WarpMesh's axis (warps.py)
        return lctx.inner_axes[name]
    if name not in names and lctx.jax_mesh is not None and name in lctx.jax_mesh[0]:
        return mesh_axis_index(lctx, name)  # a device's index in the shard_map's mesh
    if name not in names:
        raise NotImplementedError(f"lax.axis_index({name!r}) of an axis that is not one of "
                                  f"the kernel mesh's {names}")
    return lctx.program_ids[names.index(name)]


@rule(set_max_registers_p)
def _set_max_registers(lctx, eqn):
    action = nvvm.SetMaxRegisterAction.increase if eqn.params["action"] == "increase" \
        else nvvm.SetMaxRegisterAction.decrease
    nvvm.setmaxregister(eqn.params["n"], action)
    return []
