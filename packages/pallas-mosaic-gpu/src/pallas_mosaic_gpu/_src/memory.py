"""GPU memory spaces (GMEM, SMEM, TMEM, REGS), their buffer types, barrier scratch, and
``transpose_ref`` (a view that TMEM refs refuse).

``plgpu.SMEM((128, 64), jnp.float16)`` describes a scratch buffer, as upstream; TMEM
buffers (Blackwell's tensor memory) also carry whether narrow dtypes are packed and
whether the buffer is shared by a CTA pair (``collective``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas import MemoryRef
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.transforms import check_transforms


class MemorySpace(enum.Enum):
    """Where a GPU buffer lives: global memory, shared memory, tensor memory, registers."""

    GMEM = "gmem"
    SMEM = "smem"
    TMEM = "tmem"  # Blackwell only
    REGS = "regs"

    def __str__(self) -> str:
        return self.value

    def __call__(self, shape: Sequence[int], dtype: Any, *, transforms: Sequence[Any] = (),
                 packed: bool | None = None, collective: bool | None = None,
                 layout: Any = None) -> GPUMemoryRef:
        shape = tuple(int(d) for d in shape)
        dtype = jnp.dtype(dtype)
        if self is MemorySpace.TMEM:
            if transforms:
                raise ValueError(f"plgpu.TMEM{shape}: transforms are not supported for TMEM")
            if layout is not None and packed is not None:
                raise ValueError(
                    f"plgpu.TMEM{shape}: packed cannot be specified if layout is specified.")
            if layout is None and packed is None:
                if dtype.itemsize != 4:
                    raise ValueError(
                        f"plgpu.TMEM{shape}, dtype {dtype}: dtypes narrower than 32-bit "
                        "require either the packed argument or an explicit TMEM layout")
                packed = False
            collective = bool(collective)
        elif packed is not None or collective is not None or layout is not None:
            raise ValueError(
                f"plgpu.{self.name}{shape}: packed, collective and layout arguments are "
                "only supported for TMEM.")
        if transforms:
            check_transforms(transforms, shape, dtype, f"plgpu.{self.name}{shape} {dtype}")
        return GPUMemoryRef(_shaped(shape, dtype), self, transforms=tuple(transforms),
                            packed=packed, collective=collective, layout=layout)

    def like(self, shape_dtype_like: Any) -> GPUMemoryRef:
        """A buffer of this space with the shape and dtype of ``shape_dtype_like``."""
        return self(shape_dtype_like.shape, shape_dtype_like.dtype)


GMEM = MemorySpace.GMEM
SMEM = MemorySpace.SMEM
TMEM = MemorySpace.TMEM
REGS = MemorySpace.REGS


def _shaped(shape: tuple[int, ...], dtype: Any):
    return jax.core.ShapedArray(shape, dtype)


@dataclasses.dataclass(frozen=True)
class GPUMemoryRef(MemoryRef):
    """A buffer type of a GPU memory space, with the transforms the kernel sees it
    through (tiling, swizzle, transpose) and, for TMEM, packing and CTA-pair sharing."""

    transforms: tuple = ()
    packed: bool | None = dataclasses.field(default=None, kw_only=True)
    collective: bool | None = dataclasses.field(default=None, kw_only=True)
    layout: Any = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True)
class BarrierSpace:
    """The memory space of barrier refs. A barrier ref is an int32 ref of shape
    ``num_barriers`` whose space says it holds mbarriers and keeps their static
    properties (arrivals per phase; for cluster barriers, the cluster axes)."""

    kind: str = "barrier"  # or "cluster_barrier"
    num_arrivals: int = 1
    orders_tensor_core: bool = False
    collective_axes: tuple = ()
    leader_tracked: bool = False

    is_semaphore = True  # zero-initialised synchronisation state, never user data

    def __str__(self) -> str:
        return self.kind


class AccumulatorSpace(enum.Enum):
    """The memory space of ``plgpu.ACC`` refs (WGMMA accumulators, in registers)."""

    WGMMA = "wgmma_acc"

    def __str__(self) -> str:
        return self.value


def is_barrier_space(space: Any) -> bool:
    return isinstance(space, BarrierSpace)


def _barrier_counts(kind: str, num_arrivals: int, num_barriers) -> tuple[int, ...]:
    if not isinstance(num_arrivals, (int, np.integer)) or num_arrivals < 1:
        raise ValueError(
            f"plgpu.{kind}(num_arrivals=...): Num arrivals must be at least 1, but got "
            f"{num_arrivals}")
    shape = (num_barriers,) if isinstance(num_barriers, (int, np.integer)) else tuple(
        num_barriers)
    if any(int(n) < 1 for n in shape):
        raise ValueError(f"plgpu.{kind}(num_barriers=...) must be positive, got {num_barriers}")
    return tuple(int(n) for n in shape)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Barrier:
    """``num_barriers`` mbarriers in SMEM, each completing a phase after ``num_arrivals``
    arrivals (plus the bytes that TMA copies signalling it are expected to move)."""

    num_arrivals: int = 1
    num_barriers: int | Sequence[int] = 1
    orders_tensor_core: bool = False

    def __post_init__(self):
        object.__setattr__(self, "num_barriers",
                           _barrier_counts("Barrier", self.num_arrivals, self.num_barriers))

    def get_array_aval(self):
        raise ValueError("Barriers are not arrays")

    def get_memory_ref(self) -> MemoryRef:
        space = BarrierSpace("barrier", self.num_arrivals, self.orders_tensor_core)
        return MemoryRef(_shaped(self.num_barriers, jnp.int32), space)

    def get_ref_aval(self):
        return self.get_memory_ref().get_ref_aval()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterBarrier:
    """Barriers that the blocks of a cluster along ``collective_axes`` arrive on together."""

    collective_axes: tuple[str | tuple[str, ...], ...]
    num_barriers: int | Sequence[int] = 1
    num_arrivals: int = 1
    orders_tensor_core: bool = False
    leader_tracked: bool = False

    def __post_init__(self):
        object.__setattr__(self, "num_barriers", _barrier_counts(
            "ClusterBarrier", self.num_arrivals, self.num_barriers))
        axes = self.collective_axes
        object.__setattr__(self, "collective_axes",
                           (axes,) if isinstance(axes, str) else tuple(axes))

    def get_array_aval(self):
        raise ValueError("Cluster barriers are not arrays")

    def get_memory_ref(self) -> MemoryRef:
        space = BarrierSpace("cluster_barrier", self.num_arrivals, self.orders_tensor_core,
                             self.collective_axes, self.leader_tracked)
        return MemoryRef(_shaped(self.num_barriers, jnp.int32), space)

    def get_ref_aval(self):
        return self.get_memory_ref().get_ref_aval()


def transpose_ref(ref: Any, permutation: tuple[int, ...]) -> Any:
    """``ref`` with its dims permuted (e.g. a K-major SMEM tile seen as N x K)."""
    base = ref.ref if isinstance(ref, jc.TransformedRef) else ref
    if getattr(jax.typeof(base), "memory_space", None) is TMEM:
        raise ValueError("Can't transpose a TMEM reference.")
    if not isinstance(ref, jc.TransformedRef):
        ref = jc.TransformedRef(ref, ())
    return ref.transpose(tuple(permutation))
