"""TPU memory spaces and semaphore types.

``pltpu.VMEM(shape, dtype)`` (and SMEM, HBM, CMEM, VMEM_SHARED) describe scratch buffers
and ``run_scoped`` allocations; ``pltpu.VMEM`` itself (the same object as
``pltpu.MemorySpace.VMEM``) goes in ``BlockSpec(memory_space=)``. Core's ``pl.ANY`` is
understood as ``MemorySpace.ANY``.
``SemaphoreType.DMA((2,))`` is an array of two DMA semaphores; a bare
``SemaphoreType.DMA`` in ``scratch_shapes`` is a single one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import pallas as pl
from pallas import MemoryRef, plugins
from pallas import MemorySpace as CoreMemorySpace
from pallas_tpu._src import core_compat
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.enums import ValueStrEnum


def _aval(shape, dtype):
    return jc.ShapedArray(tuple(int(d) for d in shape), plugins.array_dtype(dtype))


class MemorySpace(ValueStrEnum):
    """Where a TPU buffer lives.

    ``ANY``/``HBM``: device memory, not copied into the kernel (use DMAs); ``VMEM``: the
    TensorCore's vector memory (the default for blocks); ``SMEM``: scalar memory;
    ``CMEM``: the common memory of v4/v5p; ``VMEM_SHARED``: VMEM shared by SparseCore
    subcores; ``SEMAPHORE``: semaphores; ``HOST``: host memory.
    """

    ANY = "any"
    VMEM = "vmem"
    VMEM_SHARED = "vmem_shared"
    SMEM = "smem"
    CMEM = "cmem"
    SEMAPHORE = "semaphore_mem"
    HBM = "hbm"
    HOST = "host"

    def __call__(self, shape: Sequence[int], dtype: Any = None) -> MemoryRef:
        if self is MemorySpace.SEMAPHORE:
            dtype = np.int32 if dtype in (None, semaphore_dtype) else dtype
        elif dtype is None:
            raise TypeError(f"pltpu.{self.name}(shape, dtype) needs a dtype")
        return MemoryRef(_aval(shape, dtype), self)

    def like(self, shape_dtype_like: Any) -> MemoryRef:
        """A buffer of this space with the shape and dtype of ``shape_dtype_like`` (an
        array or a ``jax.ShapeDtypeStruct``), as upstream's ``pltpu.VMEM.like(x)``."""
        return self(tuple(shape_dtype_like.shape), shape_dtype_like.dtype)

    @property
    def is_semaphore(self) -> bool:
        return self is MemorySpace.SEMAPHORE


class semaphore_dtype:  # noqa: N801 - a dtype-like marker, as upstream's
    """The dtype of a regular semaphore buffer."""

    dtype = np.dtype(np.int32)


class dma_semaphore:  # noqa: N801 - upstream name
    """The dtype-like marker of DMA semaphores (``pltpu.dma_semaphore``)."""

    dtype = np.dtype(np.int32)


class SemaphoreType(ValueStrEnum):
    """Kinds of semaphores: ``REGULAR`` (counting), ``DMA`` (DMA completion), ``BARRIER``.

    ``SemaphoreType.DMA(shape)`` makes an array of semaphores; used bare (in
    ``scratch_shapes`` or ``run_scoped``) it is a single semaphore.
    """

    REGULAR = "semaphore"
    DMA = "dma_semaphore"
    BARRIER = "barrier_semaphore"

    @property
    def is_semaphore(self) -> bool:
        return True

    def __call__(self, shape: Sequence[int] | int = ()) -> MemoryRef:
        """An array of semaphores (``SemaphoreType.DMA(2)`` or ``.DMA((2, 4))``)."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        return MemoryRef(_aval(shape, np.int32), self)

    def get_memory_ref(self) -> MemoryRef:
        return self(())

    def get_ref_aval(self):
        """The type of the ref a single semaphore of this kind is (as upstream: to trace a
        function that takes one)."""
        return self.get_memory_ref().get_ref_aval()


# ``pltpu.VMEM(shape, dtype)`` makes a buffer type, and ``pltpu.VMEM`` itself is a memory
# space (``pl.BlockSpec(memory_space=pltpu.SMEM)``): the members are both.
VMEM = MemorySpace.VMEM
SMEM = MemorySpace.SMEM
HBM = MemorySpace.HBM
CMEM = MemorySpace.CMEM
VMEM_SHARED = MemorySpace.VMEM_SHARED
SEMAPHORE = MemorySpace.SEMAPHORE


# -- classification used by validation, lowering and the interpreter -----------------------

_ANY_LIKE = {MemorySpace.ANY, CoreMemorySpace.ANY}


def canonical_space(space: Any) -> MemorySpace | SemaphoreType | None:
    """Maps core's and our memory spaces to ours (``None``: the default, VMEM for blocks)."""
    if space is None or space is CoreMemorySpace.DEFAULT:
        return None
    if isinstance(space, (MemorySpace, SemaphoreType)):
        return space
    if space in _ANY_LIKE or space is pl.ANY:
        return MemorySpace.ANY
    if space is CoreMemorySpace.HOST or space is pl.HOST:
        return MemorySpace.HOST
    if core_compat.is_semaphore_space(space):
        name = str(getattr(space, "value", space))
        if "dma" in name:
            return SemaphoreType.DMA
        if "barrier" in name:
            return SemaphoreType.BARRIER
        return SemaphoreType.REGULAR
    raise ValueError(f"memory space {space!r} is not a TPU memory space")


def is_any_space(space: Any) -> bool:
    return canonical_space(space) in (MemorySpace.ANY, MemorySpace.HBM)
