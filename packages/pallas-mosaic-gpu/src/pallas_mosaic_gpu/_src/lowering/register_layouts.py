"""Register layouts: ``plgpu.Layout`` as Mosaic GPU's register layouts, and values put in
a tiled layout (WGMMA's, its rows and columns, TCGEN05's). Helpers of the layout rules
(:mod:`rules_layout`) and of every rule that keeps arrays in a tiled layout from op to
op (elementwise ops, reductions, broadcasts, loop carries, ref reads and writes).
"""

from __future__ import annotations

from jax.experimental.mosaic.gpu import fragmented_array as fa

from pallas_mosaic_gpu._src.layouts import Layout, ParameterizedLayout, ReducedLayout
from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.context import Lit

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
        # WG_STRIDED(shape, vec_size), each positional or by keyword.
        kw = dict(zip(("shape", "vec_size"), layout.args)) | dict(layout.kwargs)
        return fa.WGStridedFragLayout(shape=tuple(kw.get("shape", shape)),
                                      vec_size=int(kw["vec_size"]))
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
