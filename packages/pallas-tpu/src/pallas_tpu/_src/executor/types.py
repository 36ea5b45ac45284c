"""MLIR types of Mosaic modules as numpy dtypes and shapes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from jaxlib.mlir import ir


class ExecutorError(RuntimeError):
    """The module cannot be executed (an unknown op, a deadlock, a DMA never waited)."""


_SCALARS = {
    "f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16, "f64": np.float64,
    "index": np.int64, "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
    "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
    # i4 (int4/uint4 operands): ml_dtypes holds one value a byte, in its low nibble.
    "i4": ml_dtypes.int4, "ui4": ml_dtypes.uint4,
    "f8E5M2": ml_dtypes.float8_e5m2, "f8E4M3FN": ml_dtypes.float8_e4m3fn,
    "f8E4M3B11FNUZ": ml_dtypes.float8_e4m3b11fnuz,
}
_INT4 = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


def np_dtype(t: ir.Type) -> np.dtype:
    """The numpy dtype holding values of the scalar MLIR type ``t`` (signless integers are
    held signed; unsigned ops reinterpret them). Semaphores are int32 counters."""
    s = str(t)
    if s in _SCALARS:
        return np.dtype(_SCALARS[s])
    if "semaphore" in s:
        return np.dtype(np.int32)
    raise ExecutorError(f"the Mosaic executor does not know the element type {t}")


def elem_and_shape(t: ir.Type) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, shape) of a scalar, vector or memref type."""
    if isinstance(t, (ir.VectorType, ir.MemRefType)):
        st = ir.ShapedType(t)
        return np_dtype(st.element_type), tuple(st.shape)
    return np_dtype(t), ()


def is_float(dt: np.dtype) -> bool:
    """Whether ``dt`` is a float type (numpy's or ml_dtypes': bf16, the 8-bit floats)."""
    return dt.kind == "f" or (dt.kind == "V" and dt not in _INT4)


def unsigned(dt: np.dtype) -> np.dtype:
    if dt in _INT4:
        return _INT4[1]
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize])


def bits(dt: np.dtype) -> int:
    if dt in _INT4:
        return 4
    return 1 if dt == np.bool_ else dt.itemsize * 8
