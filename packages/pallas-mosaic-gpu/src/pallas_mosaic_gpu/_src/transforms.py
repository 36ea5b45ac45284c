"""Layout transforms of SMEM buffers (tiling, swizzle), ref transforms, GPU BlockSpecs.

``plgpu.SMEM(shape, dtype, transforms=(TilingTransform((8, 64)), SwizzleTransform(128)))``
tells the compiler how the buffer is laid out in shared memory (what TMA and WGMMA
need); the kernel still sees the logical ``shape``. They are metadata for the
interpreters and a layout for the lowering; they are validated when the buffer type is
made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pallas import BlockSpec as CoreBlockSpec
from pallas_mosaic_gpu._src import jax_compat as jc


class Transform:
    """Base class of the layout transforms of GPU buffers (``plgpu.TilingTransform``,
    ``plgpu.SwizzleTransform``)."""

    def check(self, shape: tuple[int, ...], dtype: Any, what: str) -> tuple[int, ...]:
        """Validates the transform for a buffer; returns the shape it leaves."""
        return shape


@dataclasses.dataclass(frozen=True)
class TilingTransform(Transform):
    """Tiles the trailing dims: (M, N) tiled by (X, Y) is stored as (M/X, N/Y, X, Y)."""

    tiling: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "tiling", tuple(int(t) for t in self.tiling))
        if not self.tiling or any(t < 1 for t in self.tiling):
            raise ValueError(f"plgpu.TilingTransform({self.tiling}): tiles must be positive")

    def check(self, shape, dtype, what):
        if len(shape) < len(self.tiling):
            raise ValueError(f"{what}: tiling {self.tiling} has more dims than the shape "
                             f"{shape}")
        tail = shape[len(shape) - len(self.tiling):]
        if any(d % t for d, t in zip(tail, self.tiling)):
            raise ValueError(f"{what}: tiling {self.tiling} does not divide the trailing "
                             f"dims {tail} of shape {shape}")
        return self.tiling


@dataclasses.dataclass(frozen=True)
class SwizzleTransform(Transform):
    """Swizzles each row of ``swizzle`` bytes (32, 64 or 128) across SMEM banks."""

    swizzle: int

    def __post_init__(self):
        if self.swizzle not in (32, 64, 128):
            raise ValueError(f"Swizzle {self.swizzle} is not supported. Only 32, 64 and 128 "
                             "are accepted.")

    def check(self, shape, dtype, what):
        bits = jnp.dtype(dtype).itemsize * 8
        elems = self.swizzle * 8 // bits
        if shape and shape[-1] != elems:
            raise ValueError(
                f"{what}: Swizzle {self.swizzle} requires the trailing dimension to be of "
                f"size {elems}, but got shape: {shape}")
        return shape


def check_transforms(transforms: Sequence[Any], shape, dtype, what: str) -> None:
    """Validates a buffer's transforms in order (a swizzle applies to the tile)."""
    cur = tuple(shape)
    for t in transforms:
        if isinstance(t, Transform):
            cur = tuple(t.check(cur, dtype, what))


def transform_ref(ref: Any, transform: Any) -> Any:
    """``ref`` viewed through one more (state) transform."""
    if not isinstance(ref, jc.TransformedRef):
        if not isinstance(jax.typeof(ref), jc.AbstractRef):
            raise TypeError("plgpu.transform_ref: ref must be a reference")
        ref = jc.TransformedRef(ref, ())
    return jc.TransformedRef(ref.ref, (*ref.transforms, transform))


@dataclasses.dataclass(frozen=True)
class BlockSpec(CoreBlockSpec):
    """A GPU ``BlockSpec``: adds the SMEM ``transforms`` of the block, ``delay_release``
    (pipelining: keep a slot for that many more steps) and ``collective_axes`` (blocks
    along them load the same block, so the copy can be multicast)."""

    transforms: Sequence[Any] = ()
    delay_release: int = 0
    collective_axes: tuple[Hashable, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "transforms", tuple(self.transforms))
        if self.delay_release < 0:
            raise ValueError(f"plgpu.BlockSpec(delay_release={self.delay_release}): must be "
                             ">= 0")
        axes = self.collective_axes
        object.__setattr__(self, "collective_axes",
                           (axes,) if isinstance(axes, str) else tuple(axes))
