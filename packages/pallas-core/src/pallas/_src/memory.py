"""Memory spaces and the typed buffers (``MemoryRef``) used for scratch and ``run_scoped``."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas._src.jax_compat import AbstractRef, ShapedArray


class MemorySpace(enum.Enum):
    """Backend-neutral memory spaces. Backends add their own (VMEM, SMEM, GMEM, ...)."""

    ANY = "any"  # wherever the backend likes; the kernel sees the whole array
    DEFAULT = "default"
    ERROR = "error"  # a buffer used to report errors
    INDEX = "index"
    KEY = "key"
    HOST = "host"

    def __call__(self, shape: tuple[int, ...], dtype: Any) -> MemoryRef:
        return MemoryRef(jax_shaped(shape, dtype), self)

    def __str__(self) -> str:
        return self.value


def array_dtype(dtype: Any):
    """``dtype`` as a JAX array dtype: NumPy dtypes canonicalised, extended dtypes (typed
    PRNG keys, ``key<fry>``) kept as they are."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return dtype
    return jnp.dtype(dtype)


def jax_shaped(shape, dtype):
    return ShapedArray(tuple(int(d) for d in shape), array_dtype(dtype))


def ANY(shape: tuple[int, ...], dtype: Any) -> MemoryRef:  # noqa: N802 - upstream name
    """A buffer in the ``ANY`` memory space (no placement constraint)."""
    return MemoryRef(jax_shaped(shape, dtype), MemorySpace.ANY)


def HOST(shape: tuple[int, ...], dtype: Any) -> MemoryRef:  # noqa: N802 - upstream name
    """A buffer in host memory."""
    return MemoryRef(jax_shaped(shape, dtype), MemorySpace.HOST)


@dataclasses.dataclass(frozen=True)
class MemoryRef:
    """The type of a buffer: an inner aval (shape and dtype) plus a memory space."""

    inner_aval: Any
    memory_space: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return self.inner_aval.shape

    @property
    def dtype(self):
        return self.inner_aval.dtype

    def get_ref_aval(self):
        return AbstractRef(self.inner_aval, memory_space=self.memory_space)


def is_buffer_type(t: Any) -> bool:
    """Whether ``t`` describes a buffer (a pytree leaf in scratch/``run_scoped`` types):
    a :class:`MemoryRef`, a backend type with ``get_memory_ref()``, or any type with
    upstream's ``get_ref_aval()`` (e.g. a bare ``plgpu.SemaphoreType.REGULAR``)."""
    return (isinstance(t, MemoryRef) or hasattr(t, "get_memory_ref")
            or callable(getattr(t, "get_ref_aval", None)))


def as_memory_ref(t: Any) -> MemoryRef | None:
    """The :class:`MemoryRef` that buffer type ``t`` describes (None if it is none).

    Upstream's contract for a buffer type is ``get_ref_aval()`` (the ref it allocates);
    a type offering only that becomes a ``MemoryRef`` of that ref's shape, dtype and
    memory space."""
    if isinstance(t, MemoryRef):
        return t
    if hasattr(t, "get_memory_ref"):
        return t.get_memory_ref()
    get_ref_aval = getattr(t, "get_ref_aval", None)
    if callable(get_ref_aval):
        aval = get_ref_aval()
        inner = getattr(aval, "inner_aval", None)
        if inner is not None and hasattr(inner, "shape"):
            return MemoryRef(inner, getattr(aval, "memory_space", None))
    return None


class semaphore:  # noqa: N801 - upstream name
    """The dtype of a counting semaphore; pass ``pl.semaphore`` where a dtype is expected.

    Semaphores are represented as int32 buffers whose memory space says they are
    semaphores, so the interpreter and the backends can recognise them.
    """

    dtype = np.dtype(np.int32)


class SemaphoreSpace(enum.Enum):
    """The memory space of semaphore buffers (regular, DMA and barrier semaphores)."""

    REGULAR = "semaphore"
    DMA = "dma_semaphore"
    BARRIER = "barrier_semaphore"

    def __call__(self, shape: tuple[int, ...] = ()) -> MemoryRef:
        return MemoryRef(jax_shaped(shape, np.int32), self)

    def __str__(self) -> str:
        return self.value


def is_semaphore_space(space: Any) -> bool:
    """True for any semaphore memory space, core's or a backend's."""
    return isinstance(space, SemaphoreSpace) or bool(getattr(space, "is_semaphore", False))


def uninitialized_value(shape: tuple[int, ...], dtype: Any):
    """The value of memory nobody wrote: NaN for floats, the minimum for ints, False for bool
    (for typed PRNG keys, keys whose data is all ones)."""
    dtype = array_dtype(dtype)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        impl = dtype._impl
        data = jnp.full((*shape, *impl.key_shape), np.iinfo(np.uint32).max, jnp.uint32)
        return jax.random.wrap_key_data(data, impl=impl.name)
    if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.full(shape, jnp.nan, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.full(shape, jnp.iinfo(dtype).min, dtype)
    if dtype == jnp.bool_:
        return jnp.full(shape, False, dtype)
    return jnp.zeros(shape, dtype)
