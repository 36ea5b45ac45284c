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

    def to_mgpu(self, *args: Any, **kwargs: Any) -> Any:
        """Mosaic GPU's layout: the tiled layout's reduction over ``axes``."""
        if args or kwargs:
            raise ValueError(f"Can't instantiate {self} with arguments.")
        layout = self.layout.to_mgpu()
        from jax.experimental.mosaic.gpu import fragmented_array as fa

        if not isinstance(layout, fa.TiledLayout):
            raise ValueError("Only TiledLayout supports reductions.")
        return layout.reduce(self.axes)


@dataclasses.dataclass(frozen=True)
class ParameterizedLayout(SomeLayout):
    """A layout with arguments, e.g. ``plgpu.Layout.WG_STRIDED((128,), vec_size=2)``."""

    layout_cls: Any
    args: tuple
    kwargs: Any

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "kwargs", tuple(sorted(dict(self.kwargs).items())))

    def to_mgpu(self, *args: Any, **kwargs: Any) -> Any:
        """Mosaic GPU's layout, built from this layout's arguments."""
        if args or kwargs:
            raise ValueError(f"Can't instantiate {self} with arguments.")
        return self.layout_cls.to_mgpu(*self.args, **dict(self.kwargs))


class _TakesArguments:
    """Calling a layout enum's member with arguments names it with them."""

    def __call__(self, *args, **kwargs) -> ParameterizedLayout:
        return ParameterizedLayout(self, args, kwargs)


class Layout(_TakesArguments, SomeLayout, enum.Enum):
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

    def to_mgpu(self, *args: Any, **kwargs: Any) -> Any:
        """The Mosaic GPU register layout this names (``WG_SPLAT``, ``WG_STRIDED`` and
        ``TILED`` take its constructor's arguments), for code in ``plgpu.inline_mgpu``."""
        from jax.experimental.mosaic.gpu import fragmented_array as fa

        built = {Layout.WG_SPLAT: "WGSplatFragLayout", Layout.WG_STRIDED: "WGStridedFragLayout",
                 Layout.TILED: "TiledLayout"}
        if self in built:
            return getattr(fa, built[self])(*args, **kwargs)
        if args or kwargs:
            raise ValueError(f"Can't instantiate {self} with arguments.")
        name = _MGPU_NAMES.get(self)
        if name is None or not hasattr(fa, name):
            raise NotImplementedError(f"{self} has no Mosaic GPU register layout here")
        return getattr(fa, name)


# The fixed layouts' names in Mosaic GPU's fragmented_array module.
_MGPU_NAMES = {Layout.WGMMA: "WGMMA_LAYOUT", Layout.WGMMA_8BIT: "WGMMA_LAYOUT_8BIT",
               Layout.WGMMA_UPCAST_2X: "WGMMA_LAYOUT_UPCAST_2X",
               Layout.WGMMA_UPCAST_4X: "WGMMA_LAYOUT_UPCAST_4X",
               Layout.WGMMA_TRANSPOSED: "WGMMA_TRANSPOSED_LAYOUT",
               Layout.TCGEN05: "TCGEN05_LAYOUT",
               Layout.TCGEN05_TRANSPOSED: "TCGEN05_TRANSPOSED_LAYOUT",
               Layout.TCGEN05_TMEM_NATIVE: "TMEM_NATIVE_LAYOUT"}


class TMEMLayout(_TakesArguments, enum.Enum):
    """Layouts of TMEM buffers (block scales, sparse metadata, CTA-pair M=64)."""

    SCALES_LAYOUT = enum.auto()
    SPARSE_METADATA_LAYOUT = enum.auto()
    M64_COLLECTIVE_LAYOUT = enum.auto()
    SCALES_M64_COLLECTIVE_LAYOUT = enum.auto()


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


_RAW = ("plgpu.inline_mgpu: raw Mosaic GPU code has no meaning outside the Mosaic GPU "
        "compiler, so pallas-mosaic-gpu's interpreters cannot run it; run the kernel "
        "without interpret=True (on a GPU, or under pl.emulate_device('cuda:sm_90a'))")

inline_mgpu_p = jc.Primitive("mgpu_inline_mgpu")
inline_mgpu_p.multiple_results = True


def _inline_effects(*avals, f, arg_types, out_types, out_tree):
    effects = {jc.gpu_effect}
    effects.update(jc.WriteEffect(i) for i, a in enumerate(avals)
                   if isinstance(a, jc.AbstractRef))
    return [jc.ShapedArray(tuple(t.shape), jnp.dtype(t.dtype)) for t in out_types], effects


def _refuse_raw(*args, **params):
    raise NotImplementedError(_RAW)


inline_mgpu_p.def_effectful_abstract_eval(_inline_effects)
inline_mgpu_p.def_impl(_refuse_raw)


def inline_mgpu(*, arg_types: Any = (), return_type: Any = None):
    """Decorator for ``f(launch_ctx, *args)`` emitting raw Mosaic GPU IR inside a kernel:
    array arguments arrive as ``FragmentedArray``s in the layouts ``arg_types`` names,
    ref arguments (``RefType``) as their memrefs; ``f`` returns arrays of the types of
    ``return_type`` (a pytree of ``ShapeDtypeStruct``; ``None``: nothing). Only the
    Mosaic GPU lowering runs it (a GPU, or an emulated one)."""
    types = tuple(jax.tree.leaves(
        arg_types, is_leaf=lambda t: not isinstance(t, (tuple, list, dict))))
    out_types, out_tree = jax.tree.flatten(return_type)
    for t in out_types:
        if not isinstance(t, ShapeDtypeStruct):
            raise TypeError(f"plgpu.inline_mgpu: return_type leaves must be "
                            f"plgpu.ShapeDtypeStruct, got {t!r}")

    def decorator(f):
        def run(*args):
            flat = jax.tree.leaves(args)
            if len(flat) != len(types):
                raise ValueError(f"plgpu.inline_mgpu: {len(flat)} arguments for "
                                 f"{len(types)} arg_types")
            for a, t in zip(flat, types):
                is_ref = isinstance(jax.typeof(a), jc.AbstractRef)
                if is_ref != isinstance(t, RefType):
                    raise TypeError(f"plgpu.inline_mgpu: argument type {t!r} for "
                                    f"{'a ref' if is_ref else 'an array'}")
            outs = inline_mgpu_p.bind(*flat, f=f, arg_types=types,
                                      out_types=tuple(out_types), out_tree=out_tree)
            return None if return_type is None else jax.tree.unflatten(out_tree, outs)

        return run

    return decorator


def _interpret_inline(ctx, eqn, invals):
    raise NotImplementedError(_RAW)


INTERPRET_RULES = {layout_cast_p: lambda ctx, eqn, invals: [invals[0]],
                   inline_mgpu_p: _interpret_inline}
