"""MLIR types and attributes of Mosaic TPU kernels, from JAX avals and memory spaces."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from pallas_tpu._src.lowering.symbolic import static_shape
from pallas_tpu._src.memory import MemorySpace, SemaphoreType, canonical_space


def elem_type(dtype) -> ir.Type:
    dt = jnp.dtype(dtype)
    if dt == jnp.float32:
        return ir.F32Type.get()
    if dt == jnp.bfloat16:
        return ir.BF16Type.get()
    if dt == jnp.float16:  # computed and stored as f32 (see memory_dtype)
        return ir.F32Type.get()
    if dt == jnp.bool_:
        return ir.IntegerType.get_signless(1)
    if dt.name in ("int4", "uint4"):
        return ir.IntegerType.get_signless(4)
    if dt.name in ("int2", "uint2"):  # packed sub-elements (pack/unpack_elementwise)
        return ir.IntegerType.get_signless(2)
    if dt.kind in "iu":
        return ir.IntegerType.get_signless(dt.itemsize * 8)
    f8 = {
        "float8_e4m3fn": "Float8E4M3FNType", "float8_e5m2": "Float8E5M2Type",
        "float8_e4m3b11fnuz": "Float8E4M3B11FNUZType",
    }.get(dt.name)
    if f8 is not None and hasattr(ir, f8):
        return getattr(ir, f8).get()
    raise TypeError(f"dtype {dt.name} has no Mosaic TPU element type")


def value_type(shape, dtype) -> ir.Type:
    """Rank-0 values are scalars; others are vectors."""
    if len(shape) == 0:
        return elem_type(dtype)
    return ir.VectorType.get(static_shape(shape), elem_type(dtype))


def aval_type(aval) -> ir.Type:
    return value_type(aval.shape, aval.dtype)


def i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def index() -> ir.Type:
    return ir.IndexType.get()


def i64_attr(v: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v))


_SPACE_NAMES = {
    MemorySpace.VMEM: "vmem", MemorySpace.SMEM: "smem", MemorySpace.ANY: "any",
    MemorySpace.HBM: "hbm", MemorySpace.CMEM: "cmem", MemorySpace.VMEM_SHARED: "vmem_shared",
    MemorySpace.SEMAPHORE: "semaphore_mem", MemorySpace.HOST: "host",
}


def space_of(space, default=MemorySpace.VMEM):
    s = canonical_space(space)
    return default if s is None else s


def scratch_space(space):
    """Where a scratch buffer (``scratch_shapes``, ``run_scoped``) lives: the generic
    ``pl.ANY`` (and the default) means the backend's choice, VMEM, the memory a kernel
    can allocate in and address with vector ops (Mosaic cannot infer or allocate an
    ``any`` buffer)."""
    s = space_of(space)
    return MemorySpace.VMEM if s is MemorySpace.ANY else s


def memory_space_attr(space) -> ir.Attribute:
    s = space_of(space)
    if isinstance(s, SemaphoreType):
        s = MemorySpace.SEMAPHORE
    return ir.Attribute.parse(f"#tpu.memory_space<{_SPACE_NAMES[s]}>")


def semaphore_elem(space) -> ir.Type:
    s = space_of(space)
    if s is SemaphoreType.DMA:
        return ir.Type.parse("!tpu.dma_semaphore")
    return ir.Type.parse("!tpu.semaphore")


def is_semaphore(space) -> bool:
    s = space_of(space)
    return isinstance(s, SemaphoreType) or s is MemorySpace.SEMAPHORE


def memory_dtype(dtype):
    """The dtype a ref of ``dtype`` holds in memory: bools are stored as int32 (as
    upstream does; Mosaic cannot lay out 1-bit memrefs, and XLA's pred is a byte), and
    converted to and from ``i1`` vectors by loads and stores. float16, which Mosaic
    neither loads nor computes on any chip ("Invalid vector type for load"), is widened
    to float32: refs hold f32 and f16 values are f32 in the kernel (beyond upstream,
    which refuses f16); operands and results are converted at the custom call, so
    only the intermediate roundings differ (they are more precise)."""
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_:
        return jnp.dtype(jnp.int32)
    if dt == jnp.float16:
        return jnp.dtype(jnp.float32)
    return dt


def is_widened(dtype) -> bool:
    """Whether ``dtype`` crosses the custom call as another dtype (``memory_dtype``)."""
    return memory_dtype(dtype) != jnp.dtype(dtype)


def memref_type(shape, dtype, space) -> ir.MemRefType:
    if is_semaphore(space):
        return ir.MemRefType.get(static_shape(shape), semaphore_elem(space),
                                 memory_space=memory_space_attr(MemorySpace.SEMAPHORE))
    return ir.MemRefType.get(static_shape(shape), elem_type(memory_dtype(dtype)),
                             memory_space=memory_space_attr(space))


def splat_attr(vtype, value, dtype) -> ir.Attribute:
    dt = jnp.dtype(dtype)
    et = vtype.element_type if isinstance(vtype, ir.VectorType) else vtype
    if jnp.issubdtype(dt, jnp.floating):  # (ml_dtypes' bf16 and fp8 are kind 'V')
        scalar = ir.FloatAttr.get(et, float(value))
    elif dt == jnp.bool_:
        scalar = ir.IntegerAttr.get(et, int(bool(value)))
    else:
        v = int(value)
        bits = ir.IntegerType(et).width
        if jnp.issubdtype(dt, jnp.unsignedinteger) and v >= 1 << (bits - 1):
            v -= 1 << bits  # signless attrs hold the two's-complement value
        scalar = ir.IntegerAttr.get(et, v)
    if isinstance(vtype, ir.VectorType):
        return ir.DenseElementsAttr.get_splat(vtype, scalar)
    return scalar


def np_dtype(dtype):
    return np.dtype(jnp.dtype(dtype))
