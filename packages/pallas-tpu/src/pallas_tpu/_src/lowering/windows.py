"""Ref windows: ``ref[...]`` indexers (``pl.ds`` windows, strides, integer indices,
bitcasts and reshapes) applied to a :class:`~.values.RefVal`, and the loads and stores
of a window. Emission helpers below the rule modules (``rules_refs``, ``rules_tpu``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, vector
from jaxlib.mosaic.python import tpu

from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.enums import MosaicUnsupported
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import (
    cmpi,
    const,
    to_i32,
    to_index,
)
from pallas_tpu._src.lowering.symbolic import static_dim
from pallas_tpu._src.lowering.values import Lit, RefVal
from pallas_tpu._src.memory import MemorySpace

# ------------------------------------------------------------------------------------------
# Refs: indexing, loads and stores.


class Window:
    """A rectangular view of a memref: per memref dim a start, a size and whether the
    dim is dropped (integer-indexed or squeezed)."""

    def __init__(self, ref: RefVal):
        self.ref = ref
        self.starts = [0] * len(ref.squeezed)
        self.sizes = list(ref.memref_shape)
        self.dropped = list(ref.squeezed)
        self.strides = [1] * len(ref.squeezed)
        # Dims sliced with a run-time size (pl.ds(start, size) with a traced size): their
        # size is MLIR's dynamic size and the value is here. Only DMAs take such views.
        self.dynamic_sizes: dict[int, ir.Value] = {}

    def check_static(self, what: str) -> None:
        """Refuses a view of run-time size for anything but a DMA."""
        if self.dynamic_sizes:
            raise NotImplementedError(
                f"{what} a ref view whose size is known only at run time (pl.ds(start, "
                f"size) with a traced size, dims {sorted(self.dynamic_sizes)}): Mosaic TPU "
                f"copies such views with DMAs only; load and store static sizes")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for s, d in zip(self.sizes, self.dropped) if not d)

    @property
    def full_shape(self) -> tuple[int, ...]:
        return tuple(self.sizes)


def apply_transforms(ref: RefVal, flat, tree) -> Window:
    """Applies ``ref.at[...]`` indexers (leaves from the eqn) to a window of ``ref``."""
    transforms = jax.tree_util.tree_unflatten(tree, flat)
    w = Window(ref)
    for t in transforms:
        if isinstance(t, (jc.ReshapeTransform, jc.BitcastTransform)):
            w = Window(_reshaped_or_bitcast(w, t))
            continue
        if not isinstance(t, jc.NDIndexer):
            raise NotImplementedError(
                f"ref transform {type(t).__name__} (ref.bitcast/ref.reshape) is not "
                f"implemented yet in pallas-tpu lowering"
            )
        if tuple(getattr(t, "int_indexer_shape", ())):
            raise NotImplementedError("gather-style (array) ref indexing")
        visible = [i for i, d in enumerate(w.dropped) if not d]
        if len(t.indices) != len(visible):
            raise ValueError(f"indexer of rank {len(t.indices)} on a ref of rank {len(visible)}")
        for dim, idx in zip(visible, t.indices):
            # An index into a strided view steps by the view's stride.
            scale = w.strides[dim]
            if isinstance(idx, jc.Slice):
                w.starts[dim] = _add(w.starts[dim], _scaled(idx.start, scale))
                if isinstance(idx.size, ir.Value):
                    if int(idx.stride) != 1 or scale != 1:
                        raise NotImplementedError(
                            "a strided ref view whose size is known only at run time")
                    w.sizes[dim] = ir.ShapedType.get_dynamic_size()
                    w.dynamic_sizes[dim] = to_i32(idx.size)
                else:
                    w.sizes[dim] = static_dim(idx.size.val if isinstance(idx.size, Lit)
                                              else idx.size)
                    w.dynamic_sizes.pop(dim, None)
                w.strides[dim] = scale * int(idx.stride)
            else:
                if isinstance(idx, ir.Value) and isinstance(idx.type, ir.VectorType) or (
                        isinstance(idx, Lit) and np.ndim(idx.val)):
                    raise NotImplementedError("gather-style (array) ref indexing")
                w.starts[dim] = _add(w.starts[dim], _scaled(idx, scale))
                w.sizes[dim] = 1
                w.dropped[dim] = True
    return w


def _reshaped_or_bitcast(w: Window, t) -> RefVal:
    """``ref.reshape(...)`` / ``ref.bitcast(...)`` of the current window: the window's
    memref, then ``tpu.memref_reshape`` or ``tpu.memref_bitcast`` (Mosaic checks that the
    new shape keeps the memory layout's tiling)."""
    ref = w.ref
    w.check_static("ref.reshape/ref.bitcast of")
    if _strided(w):
        raise NotImplementedError("ref.reshape/ref.bitcast of a strided ref view")
    src = window_memref(w)
    aval = jc.transform_type([t], jc.ShapedArray(w.shape, ref.dtype))
    space = T.space_of(ref.space)
    if isinstance(t, jc.ReshapeTransform):
        mem = jnp.int16 if is_bit_view(ref) else aval.dtype
        new = tpu.memref_reshape(T.memref_type(aval.shape, mem, space), src)
    else:
        widened = [d for d in (ref.dtype, aval.dtype) if T.is_widened(d)
                   and not (d == ref.dtype and is_bit_view(ref))
                   and not (d == aval.dtype and jnp.dtype(d) == jnp.float16)]
        if widened:
            d = jnp.dtype(widened[0])
            raise NotImplementedError(
                f"ref.bitcast {jnp.dtype(ref.dtype).name} -> {jnp.dtype(aval.dtype).name}: "
                f"a {d.name} ref holds {T.memory_dtype(d)} in pallas-tpu's kernels (bool as "
                f"int32, float16 as float32); only a float16 view made by ref.bitcast holds "
                f"float16's bits")
        # A float16 view made by ref.bitcast keeps the bits, as int16 in memory.
        mem = jnp.int16 if jnp.dtype(aval.dtype) == jnp.float16 else aval.dtype
        new_t = T.memref_type(aval.shape, mem, space)
        new = src if new_t == src.type else tpu.memref_bitcast(new_t, src)
    return RefVal(new, aval.dtype, ref.space, (False,) * len(aval.shape))


def is_bit_view(ref: RefVal) -> bool:
    """Whether ``ref`` is a float16 view made by ``ref.bitcast``: it holds float16's bits
    (as int16), not the float32 a float16 operand holds in pallas-tpu's kernels."""
    return (jnp.dtype(ref.dtype) == jnp.float16
            and ir.MemRefType(ref.memref.type).element_type == T.elem_type(jnp.int16))


def _check_not_bit_view(ref: RefVal, what: str) -> None:
    if is_bit_view(ref):
        raise NotImplementedError(
            f"{what} a float16 view made by ref.bitcast: Mosaic TPU has no float16 vectors "
            f"on any chip; bitcast the ref on to int16, bfloat16 or a 32-bit type first")


def _scaled(i, k: int):
    """``i * k`` for a static or dynamic index ``i``."""
    if k == 1:
        return i
    if isinstance(i, Lit):
        i = int(np.asarray(i.val))
    if isinstance(i, int | np.integer):
        return int(i) * k
    return arith.muli(to_index(i), to_index(k))


def _add(a, b):
    if isinstance(b, Lit):
        b = int(np.asarray(b.val))
    if isinstance(a, int) and isinstance(b, int | np.integer):
        return a + int(b)
    if isinstance(a, int) and a == 0:
        return b
    return arith.addi(to_index(a), to_index(b))


def window_indices(w: Window) -> list:
    return [to_index(s) for s in w.starts]


def _static_zero(w: Window) -> bool:
    return all(isinstance(s, int) and s == 0 for s in w.starts)


def window_memref(w: Window) -> ir.Value:
    """A memref for the window (tpu.memref_slice + tpu.memref_squeeze)."""
    ref = w.ref
    src = ref.memref
    mt = ir.MemRefType(src.type)
    if _strided(w):
        raise NotImplementedError("DMAs or semaphores on strided ref views")
    if tuple(w.sizes) != tuple(mt.shape) or not _static_zero(w):
        t = ir.MemRefType.get(w.sizes, mt.element_type, memory_space=mt.memory_space)
        src = tpu.memref_slice(t, src, [to_i32(s) for s in w.starts],
                               [w.dynamic_sizes[d] for d in sorted(w.dynamic_sizes)])
    if any(w.dropped):
        shape = [s for s, d in zip(w.sizes, w.dropped) if not d]
        t = ir.MemRefType.get(shape, mt.element_type, memory_space=mt.memory_space)
        src = tpu.memref_squeeze(t, src)
    return src


def _is_smem(ref: RefVal) -> bool:
    return T.space_of(ref.space) is MemorySpace.SMEM


def _strided(w: Window) -> bool:
    if any(s != 1 for s in w.strides):
        full = T.value_type(w.full_shape, w.ref.dtype)
        last = ir.MemRefType(w.ref.memref.type).shape[-1]
        if w.strides[-1] != 1 and last != 128:
            raise MosaicUnsupported(
                f"a strided access (stride {w.strides[-1]}) along the last (lane) dim of "
                f"a ref of shape {w.ref.kernel_shape} ({full}): Mosaic TPU implements lane "
                f"strides only in refs whose last dim is 128 ('Not Implemented: The last "
                f"dim size is not 128 in original base memref' on v5e and v6e); stride "
                f"the rows, or load the lanes and select them")
        return True
    return False


def _check_vector_window(w: Window, what: str) -> None:
    """VMEM accesses go through vector ops, which need a memref of rank >= 1."""
    if not w.full_shape:
        raise NotImplementedError(
            f"{what} a ()-shaped (0-d) VMEM ref: Mosaic TPU vector memory holds arrays of "
            f"rank >= 1 (give the operand shape (1, 1) or place it in SMEM with "
            f"pl.BlockSpec(memory_space=pltpu.SMEM))"
        )


# Memories a TensorCore reaches only by DMA: no vector or scalar load/store addresses them.
_DMA_ONLY = (MemorySpace.ANY, MemorySpace.HBM, MemorySpace.HOST)


def _check_addressable(w: Window, upstream: str) -> None:
    """Loads and stores address VMEM and SMEM only: the TPU compiler rejects one of an
    ANY/HBM ref ("Failed to propagate a memory space change"); refused here, at lowering,
    with upstream's message (``upstream``) and what to do instead."""
    space = T.space_of(w.ref.space)
    if space in _DMA_ONLY:
        extra = (" ANY memory space can only be accessed using async_copy."
                 if space is MemorySpace.ANY else "")
        raise ValueError(
            f"{upstream} are only allowed on VMEM and SMEM references.{extra} (a ref of "
            f"shape {w.ref.kernel_shape} and dtype {jnp.dtype(w.ref.dtype).name} in "
            f"memory space {space.value}: copy it to VMEM with pltpu.async_copy or "
            f"pltpu.sync_copy, or give the operand a VMEM BlockSpec)")


def load_window(w: Window, dtype) -> ir.Value:
    w.check_static("a load of")
    _check_not_bit_view(w.ref, "a load of")
    _check_addressable(w, "Loads")
    if jnp.dtype(dtype) == jnp.bool_:  # stored as int32 (see T.memory_dtype)
        v = load_window(w, jnp.int32)
        return cmpi(arith.CmpIPredicate.ne, v, const(w.shape, jnp.int32, 0))
    ref = w.ref
    if _is_smem(ref):
        if w.shape:
            raise NotImplementedError("vector loads from SMEM (SMEM holds scalars)")
        return memref.load(ref.memref, window_indices(w))
    _check_vector_window(w, "loading from")
    full_t = T.value_type(w.full_shape, dtype)
    if _strided(w):
        v = tpu.strided_load(full_t, ref.memref, window_indices(w), list(w.strides))
    else:
        v = vector.load(full_t, ref.memref, window_indices(w))
    shape = w.shape
    if not shape:
        return vector.extract(v, [], [0] * len(w.full_shape))
    if tuple(shape) != tuple(w.full_shape):
        v = vector.shape_cast(T.value_type(shape, dtype), v)
    return v


def store_window(w: Window, value: ir.Value, dtype, mask=None) -> None:
    w.check_static("a store to")
    _check_not_bit_view(w.ref, "a store to")
    _check_addressable(w, "Loads and stores")
    if jnp.dtype(dtype) == jnp.bool_:  # stored as int32 (see T.memory_dtype)
        value = arith.extui(T.value_type(w.shape, jnp.int32), value)
        dtype = jnp.int32
    ref = w.ref
    if _is_smem(ref):
        if w.shape:
            raise NotImplementedError("vector stores to SMEM (SMEM holds scalars)")
        memref.store(value, ref.memref, window_indices(w))
        return
    _check_vector_window(w, "storing to")
    full = w.full_shape
    if not w.shape:
        value = vector.broadcast(T.value_type(full, dtype), value)
    elif tuple(w.shape) != tuple(full):
        value = vector.shape_cast(T.value_type(full, dtype), value)
    if _strided(w):
        if mask is not None:
            raise NotImplementedError("masked strided stores")
        tpu.strided_store(value, ref.memref, window_indices(w), list(w.strides))
        return
    if mask is not None:
        if tuple(w.shape) != tuple(full):
            mask = vector.shape_cast(T.value_type(full, jnp.bool_), mask)
        tpu.vector_store(value, ref.memref, window_indices(w), mask=mask)
        return
    vector.store(value, ref.memref, window_indices(w))
