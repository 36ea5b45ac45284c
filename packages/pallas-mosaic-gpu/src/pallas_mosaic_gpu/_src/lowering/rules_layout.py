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
holds it in (strided), which is the same array.
"""

from __future__ import annotations

import jax
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa

from pallas_mosaic_gpu._src.layouts import (
    Layout,
    ParameterizedLayout,
    ReducedLayout,
    RefType,
    inline_mgpu_p,
    layout_cast_p,
)
from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import KernelError, Lit, RefVal, rule

_TILED = {
    Layout.WGMMA: "WGMMA_LAYOUT",
    Layout.WGMMA_8BIT: "WGMMA_LAYOUT_8BIT",
    Layout.WGMMA_UPCAST_2X: "WGMMA_LAYOUT_UPCAST_2X",
    Layout.WGMMA_UPCAST_4X: "WGMMA_LAYOUT_UPCAST_4X",
    Layout.WGMMA_TRANSPOSED: "WGMMA_TRANSPOSED_LAYOUT",
    Layout.TCGEN05: "TCGEN05_LAYOUT",
    Layout.TCGEN05_TRANSPOSED: "TCGEN05_TRANSPOSED_LAYOUT",
}
_REDUCED = {(Layout.WGMMA, (1,)): "WGMMA_ROW_LAYOUT", (Layout.WGMMA, (0,)): "WGMMA_COL_LAYOUT",
            (Layout.TCGEN05, (1,)): "TCGEN05_ROW_LAYOUT",
            (Layout.TCGEN05, (0,)): "TCGEN05_COL_LAYOUT"}


def mgpu_layout(layout, shape) -> fa.FragmentedLayout | None:
    """Mosaic GPU's register layout for a ``plgpu.Layout`` (None: one this engine does
    not build arrays in)."""
    name = None
    if isinstance(layout, Layout):
        name = _TILED.get(layout)
        if layout is Layout.WG_SPLAT:
            return fa.WGSplatFragLayout(tuple(shape))
    elif isinstance(layout, ReducedLayout):
        name = _REDUCED.get((layout.layout, tuple(sorted(layout.axes))))
    elif isinstance(layout, ParameterizedLayout) and layout.layout_cls is Layout.WG_STRIDED:
        kw = dict(layout.kwargs)
        shape_arg = layout.args[0] if layout.args else kw.get("shape", shape)
        return fa.WGStridedFragLayout(shape=tuple(shape_arg), vec_size=int(kw["vec_size"]))
    return getattr(fa, name, None) if name else None


def hinted_layout(lctx, var, shape) -> fa.FragmentedLayout | None:
    """The layout a ``layout_cast`` of ``var`` asks for, if there is one."""
    hint = lctx.layout_hints.get(var)
    return None if hint is None else mgpu_layout(hint, shape)


# The 2D tiled layouts a reduced (row/column) layout broadcasts back to.
_FULL = (fa.WGMMA_LAYOUT, fa.TCGEN05_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT,
         fa.TCGEN05_TRANSPOSED_LAYOUT)


def is_tiled(x) -> bool:
    """Whether ``x`` is an array in a tiled layout (WGMMA and its relatives)."""
    return isinstance(x, V.FragmentedArray) and isinstance(x.layout, fa.TiledLayout)


def in_layout(x, aval, layout) -> V.FragmentedArray:
    """``x`` (array, Small, scalar or literal of ``aval``) in register ``layout``."""
    shape = tuple(aval.shape)
    if isinstance(x, V.FragmentedArray):
        if x.layout == layout:
            return x
        if isinstance(x.layout, fa.WGSplatFragLayout):
            return V.FragmentedArray.splat(x.registers.item(), shape, layout,
                                           is_signed=x.is_signed)
        try:
            return x.to_layout(layout)
        except NotImplementedError as e:
            raise NotImplementedError(
                f"changing the register layout of a {shape} array from {x.layout} to "
                f"{layout}") from e
    if isinstance(x, small.Small):
        first = x.values.flat[0]
        if all(v is first for v in x.values.flat):
            return V.FragmentedArray.splat(first, shape, layout, is_signed=V.signed(aval.dtype))
        return V.FragmentedArray.build(shape, layout, lambda *idx: small.element(x, list(idx)),
                                       is_signed=V.signed(aval.dtype))
    if isinstance(x, Lit) or not shape or not hasattr(x, "layout"):
        value = V.scalar(x, aval.update(shape=())) if shape else V.scalar(x, aval)
        return V.FragmentedArray.splat(value, shape, layout, is_signed=V.signed(aval.dtype))
    raise NotImplementedError(f"a {type(x).__name__} in the layout {layout}")


def full_layout(reduced, shape, dims):
    """The 2D tiled layout whose reduction over the dims not in ``dims`` is ``reduced``
    (the layout ``broadcast_in_dim`` of a row/column array produces), or None."""
    if len(shape) != 2:
        return None
    new = tuple(d for d in range(len(shape)) if d not in dims)
    for full in _FULL:
        if full.reduce(new) == reduced:
            return full
    return None


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
