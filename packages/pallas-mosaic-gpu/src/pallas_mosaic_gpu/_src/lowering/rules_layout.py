"""``plgpu.layout_cast`` (and so ``plgpu.load(..., layout=)`` and
``plgpu.broadcasted_iota(..., layout=)``): a value's register layout.

A layout changes no value, only how the warpgroup holds it. Upstream reads the cast as
a conversion under ``LoweringSemantics.Lane`` (looking ahead from a value's creation to
a cast right after it) and as a constraint for layout inference under
``LoweringSemantics.Warpgroup``. Here, in both: an ``iota`` whose value is cast is
created in the cast's layout (so ``layout_cast(broadcasted_iota(...), Layout.WGMMA)``
lines up with a WGMMA-layout load or accumulator, as upstream's kernels expect); the
cast converts an array Mosaic GPU can convert; otherwise the value stays in the layout
the engine holds it in (strided, see :mod:`values`), which is the same array.
"""

from __future__ import annotations

from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa

from pallas_mosaic_gpu._src.layouts import Layout, ParameterizedLayout, ReducedLayout, layout_cast_p
from pallas_mosaic_gpu._src.lowering.engine import rule

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


@rule(layout_cast_p)
def _layout_cast(lctx, eqn, x):
    target = mgpu_layout(eqn.params["new_layout"], eqn.outvars[0].aval.shape)
    if target is None or not isinstance(x, mgpu.FragmentedArray) or x.layout == target:
        return x
    try:
        return x.to_layout(target)
    except (NotImplementedError, ValueError):
        return x  # Mosaic GPU has no such conversion; the engine's layout holds the same
