"""MLIR types as NumPy: element dtypes, shapes, and the integer views MLIR ops take.

Signless integers are held signed (the unsigned ops view them as unsigned); ``i1`` is
``bool``; ``index`` is int64; the narrow floats (bf16, the float8/float4 types) and the
4-bit integers are ml_dtypes' types (through ``jax.numpy``). A backend adds its own
element types (semaphores, pointers) with :func:`register_element_type`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from pallas._src.executor.errors import ExecutorUnsupported

_SCALARS: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16), "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
    "bf16": np.dtype(jnp.bfloat16), "index": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8), "ui16": np.dtype(np.uint16), "ui32": np.dtype(np.uint32),
    "ui64": np.dtype(np.uint64),
    # i4 (int4/uint4 operands): ml_dtypes holds one value a byte, in its low nibble.
    "i4": np.dtype(jnp.int4), "ui4": np.dtype(jnp.uint4),
}
for _mlir, _jnp in (("f8E5M2", "float8_e5m2"), ("f8E4M3FN", "float8_e4m3fn"),
                    ("f8E4M3B11FNUZ", "float8_e4m3b11fnuz"), ("f8E4M3FNUZ", "float8_e4m3fnuz"),
                    ("f8E5M2FNUZ", "float8_e5m2fnuz"), ("f8E8M0FNU", "float8_e8m0fnu"),
                    ("f4E2M1FN", "float4_e2m1fn")):
    if hasattr(jnp, _jnp):
        _SCALARS[_mlir] = np.dtype(getattr(jnp, _jnp))
_INTS = {1: np.dtype(np.bool_), 8: np.dtype(np.int8), 16: np.dtype(np.int16),
         32: np.dtype(np.int32), 64: np.dtype(np.int64)}
INT4 = (np.dtype(jnp.int4), np.dtype(jnp.uint4))
_EXTRA: list[tuple[Callable[[str], bool], np.dtype]] = []


def register_element_type(matches: Callable[[str], bool], dtype) -> None:
    """Element types of a backend's dialect: a type whose text ``matches`` is held as
    ``dtype`` (e.g. TPU semaphores as int32 counters, LLVM pointers as int64)."""
    _EXTRA.append((matches, np.dtype(dtype)))
    _scalar_dtype.cache_clear()


def scalar_dtype(s: str) -> np.dtype:
    """The dtype of the scalar MLIR type spelled ``s`` (``"i32"``, ``"bf16"``, ...)."""
    return _scalar_dtype(s)


@functools.cache
def _scalar_dtype(s: str) -> np.dtype:
    if s in _SCALARS:
        return _SCALARS[s]
    m = re.fullmatch(r"i(\d+)", s)
    if m and int(m.group(1)) in _INTS:
        return _INTS[int(m.group(1))]
    for matches, dt in _EXTRA:
        if matches(s):
            return dt
    raise ExecutorUnsupported(f"the executor has no numpy type for the MLIR type {s}")


def dtype_of(t: ir.Type) -> np.dtype:
    """The dtype of a scalar type, or of a vector/memref type's elements."""
    if isinstance(t, (ir.VectorType, ir.MemRefType)):
        t = ir.ShapedType(t).element_type
    return _scalar_dtype(str(t))


def vshape(t: ir.Type) -> tuple[int, ...]:
    """The vector shape of a value of type ``t`` (``()`` for scalars and memrefs)."""
    return tuple(ir.VectorType(t).shape) if isinstance(t, ir.VectorType) else ()


def elem_and_shape(t: ir.Type) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, shape) of a scalar, vector or memref type."""
    if isinstance(t, (ir.VectorType, ir.MemRefType)):
        st = ir.ShapedType(t)
        return _scalar_dtype(str(st.element_type)), tuple(st.shape)
    return _scalar_dtype(str(t)), ()


def is_float(dt: np.dtype) -> bool:
    """Whether ``dt`` is a float type (numpy's or ml_dtypes': bf16, the 8-bit floats)."""
    return dt.kind == "f" or (dt.kind == "V" and dt not in INT4)


def unsigned(dt: np.dtype) -> np.dtype:
    """The unsigned integer type of ``dt``'s width."""
    if dt in INT4:
        return INT4[1]
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize])


def as_unsigned(x) -> np.ndarray:
    """The integers ``x`` viewed as unsigned (bools and floats as they are)."""
    x = np.asarray(x)
    if x.dtype == np.bool_ or not (x.dtype.kind in "iu" or x.dtype in INT4):
        return x
    return x.view(unsigned(x.dtype))


def bits(dt: np.dtype) -> int:
    """The width of ``dt`` in bits (``i1`` is 1, the 4-bit integers 4)."""
    if dt in INT4:
        return 4
    return 1 if dt == np.bool_ else dt.itemsize * 8


def int_array_attr(a) -> list[int]:
    """The ints of a ``DenseI64ArrayAttr``/``DenseI32ArrayAttr`` or an ``ArrayAttr`` of
    ``IntegerAttr``."""
    try:
        return [int(v) for v in a]
    except TypeError:
        return [int(ir.IntegerAttr(v).value) for v in ir.ArrayAttr(a)]
