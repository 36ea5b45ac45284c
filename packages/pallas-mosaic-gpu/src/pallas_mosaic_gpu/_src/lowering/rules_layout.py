"""Register layouts in the lowering: ``plgpu.layout_cast`` (and so ``plgpu.load(...,
layout=)`` and ``plgpu.broadcasted_iota(..., layout=)``) and arrays that keep a tiled
layout (WGMMA's, its rows and columns, TCGEN05's) from op to op.

A layout changes no value, only how the warpgroup holds it. By default an array is
strided (see :mod:`values`). ``layout_cast`` to a tiled layout, reading a ``plgpu.ACC``
and loading a tiled SMEM ref give an array in a tiled (``TiledLayout``) layout instead,
and elementwise ops, reductions, broadcasts, casts and loop carries keep it there:
``s.max(axis=1)`` of a WGMMA array is a warp shuffle reduction into the WGMMA row
layout, and ``broadcast_in_dim`` of that row back to the WGMMA layout copies registers,
with no shared memory involved.

Upstream reads the cast as a conversion under ``LoweringSemantics.Lane`` (looking ahead
from a value's creation to a cast right after it) and as a constraint for layout
inference under ``LoweringSemantics.Warpgroup``. Here, in both: an ``iota`` whose value
is cast is created in the cast's layout (so ``layout_cast(broadcasted_iota(...),
Layout.WGMMA)`` lines up with a WGMMA-layout load or accumulator); splats, literals and
arrays held whole by every thread are put in the tiled layout asked for; an array
Mosaic GPU can convert is converted; otherwise the value stays in the layout the engine
holds it in (strided), which is the same array. The layout helpers are in
:mod:`register_layouts`.
"""

from __future__ import annotations

import jax
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa

from pallas_mosaic_gpu._src.layouts import RefType, inline_mgpu_p, layout_cast_p
from pallas_mosaic_gpu._src.lowering.engine import KernelError, RefVal, rule
from pallas_mosaic_gpu._src.lowering.register_layouts import in_layout, mgpu_layout


@rule(layout_cast_p)
def _layout_cast(lctx, eqn, x):
    aval = eqn.invars[0].aval
    target = mgpu_layout(eqn.params["new_layout"], aval.shape)
    if target is None or not aval.shape:
        return x
    splat = isinstance(x, mgpu.FragmentedArray) and isinstance(x.layout, fa.WGSplatFragLayout)
    if isinstance(target, fa.TiledLayout) and (splat or not isinstance(x, mgpu.FragmentedArray)):
        return in_layout(x, aval, target)  # a literal, scalar, splat or held-whole array
    if not isinstance(x, mgpu.FragmentedArray) or x.layout == target:
        return x
    try:
        return x.to_layout(target)
    except (NotImplementedError, ValueError):
        return x  # Mosaic GPU has no such conversion; the engine's layout holds the same


@rule(inline_mgpu_p)
def _inline_mgpu(lctx, eqn, *args):
    """``plgpu.inline_mgpu``: calls the user's function with the launch context, the
    array arguments in the layouts their ``arg_types`` name and the ref arguments'
    memrefs; its results (FragmentedArrays) are the eqn's values."""
    p = eqn.params
    vals = []
    for x, t, v in zip(args, p["arg_types"], eqn.invars):
        if isinstance(t, RefType):
            if not isinstance(x, RefVal):
                raise NotImplementedError(f"plgpu.inline_mgpu: a ref argument held as "
                                          f"{type(x).__name__}")
            vals.append(x.memref)
            continue
        aval = v.aval
        target = mgpu_layout(t, aval.shape)
        if target is None:
            raise NotImplementedError(f"plgpu.inline_mgpu: argument layout {t!r}")
        if isinstance(target, fa.TiledLayout) or not isinstance(x, mgpu.FragmentedArray):
            x = in_layout(x, aval, target)
        elif x.layout != target:
            x = x.to_layout(target)
        vals.append(x)
    outs = p["f"](lctx.launch_ctx, *vals)
    flat = [] if not p["out_types"] else jax.tree.leaves(
        outs, is_leaf=lambda o: isinstance(o, mgpu.FragmentedArray))
    if len(flat) != len(p["out_types"]):
        raise KernelError(f"plgpu.inline_mgpu: the function returned {len(flat)} arrays "
                          f"for a return_type of {len(p['out_types'])}")
    for o, t in zip(flat, p["out_types"]):
        if not isinstance(o, mgpu.FragmentedArray) or tuple(o.shape) != tuple(t.shape):
            raise KernelError(f"plgpu.inline_mgpu: the function returned {o!r} for "
                              f"{t!r}")
    return flat
