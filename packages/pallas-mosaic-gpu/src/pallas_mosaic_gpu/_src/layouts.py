"""Register layouts: ``plgpu.Layout``/``TMEMLayout`` and the primitives that fix a value's
layout (``layout_cast``, ``load``, ``broadcasted_iota``).

A layout says how an array is spread over a warpgroup's registers (or TMEM); it changes
no value. The interpreters therefore compute ``layout_cast(x, l) == x``; the lowering
reads the layout from the primitive's parameters.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas_mosaic_gpu._src import jax_compat as jc


class SomeLayout:
    """Base of the layout descriptions a kernel can name."""

    def reduce(self, axes: int | Sequence[int]) -> SomeLayout:
        """The layout of a value of this layout with ``axes`` reduced away (e.g. the
        row statistics of a WGMMA accumulator: ``Layout.WGMMA.reduce(1)``)."""
        return ReducedLayout(self, (axes,) if isinstance(axes, int) else tuple(axes))


@dataclasses.dataclass(frozen=True)
class ReducedLayout(SomeLayout):
    """``layout`` with ``axes`` reduced away (only tiled layouts reduce when lowering)."""

    layout: SomeLayout
    axes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ParameterizedLayout(SomeLayout):
    """A layout with arguments, e.g. ``plgpu.Layout.WG_STRIDED((128,), vec_size=2)``."""

    layout_cls: Any
    args: tuple
    kwargs: Any

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "kwargs", tuple(sorted(dict(self.kwargs).items())))


class Layout(SomeLayout, enum.Enum):
    """Register layouts of Mosaic GPU (WGMMA fragments, splats, strided, tiled, TCGEN05)."""

    WGMMA = enum.auto()
    WGMMA_8BIT = enum.auto()
    WGMMA_UPCAST_2X = enum.auto()
    WGMMA_UPCAST_4X = enum.auto()
    WGMMA_TRANSPOSED = enum.auto()
    WG_SPLAT = enum.auto()
    WG_STRIDED = enum.auto()
    TILED = enum.auto()
    TCGEN05 = enum.auto()
    TCGEN05_TRANSPOSED = enum.auto()
    TCGEN05_M64_COLLECTIVE = enum.auto()
    TCGEN05_TMEM_NATIVE = enum.auto()
    TCGEN05_M64_COLLECTIVE_NATIVE = enum.auto()
    SMEM_GMEM_COPY = enum.auto()
    TMA_INDICES = enum.auto()
    TMA_INDICES_4 = enum.auto()

    def __call__(self, *args, **kwargs) -> ParameterizedLayout:
        return ParameterizedLayout(self, args, kwargs)


class TMEMLayout(enum.Enum):
    """Layouts of TMEM buffers (block scales, sparse metadata, CTA-pair M=64)."""

    SCALES_LAYOUT = enum.auto()
    SPARSE_METADATA_LAYOUT = enum.auto()
    M64_COLLECTIVE_LAYOUT = enum.auto()
    SCALES_M64_COLLECTIVE_LAYOUT = enum.auto()

    def __call__(self, *args, **kwargs) -> ParameterizedLayout:
        return ParameterizedLayout(self, args, kwargs)


def _check_layout(layout: Any, fn: str) -> Any:
    if layout is not None and not isinstance(layout, (SomeLayout, TMEMLayout)):
        raise TypeError(f"plgpu.{fn}: layout must be a plgpu.Layout (or Layout.X(...)), got "
                        f"{layout!r}")
    return layout


layout_cast_p = jc.Primitive("mgpu_layout_cast")
layout_cast_p.def_abstract_eval(lambda aval, *, new_layout: aval)
layout_cast_p.def_impl(lambda x, *, new_layout: x)
jc.mlir.register_lowering(layout_cast_p, lambda ctx, x, *, new_layout: [x])


def layout_cast(x: Any, new_layout: Any) -> jax.Array:
    """``x`` with its registers laid out as ``new_layout`` (the values do not change)."""
    _check_layout(new_layout, "layout_cast")
    return layout_cast_p.bind(jnp.asarray(x), new_layout=new_layout)


def broadcasted_iota(dtype: Any, shape: Sequence[int], dimension: int, *,
                     layout: Any = None) -> jax.Array:
    """``lax.broadcasted_iota`` in register layout ``layout``."""
    x = lax.broadcasted_iota(dtype, tuple(shape), dimension)
    return x if layout is None else layout_cast(x, layout)


def load(src: Any, idx: Any, *, layout: Any = None, optimized: bool = True) -> jax.Array:
    """``src[idx]`` read into registers in ``layout`` (``optimized``: let the compiler
    pick vectorised accesses)."""
    del optimized
    x = src[idx]
    return x if layout is None else layout_cast(x, layout)


def print_layout(fmt: str, x: Any) -> None:
    """Prints ``fmt`` with ``{}`` replaced by ``x``'s type (the register layout itself is
    chosen by the Mosaic GPU compiler; the interpreters have none)."""
    aval = jax.typeof(x)
    print(fmt.format(f"{aval.str_short()} (layout chosen when lowering to Mosaic GPU)"))


@dataclasses.dataclass(frozen=True)
class ShapeDtypeStruct:
    """An array type with a register layout (argument/result types of ``inline_mgpu``)."""

    shape: tuple[int, ...]
    dtype: Any
    layout: Any


@dataclasses.dataclass(frozen=True)
class RefType:
    """A ref argument type of ``inline_mgpu`` (with the transforms it is seen through)."""

    transforms: tuple = ()


INTERPRET_RULES = {layout_cast_p: lambda ctx, eqn, invals: [invals[0]]}
