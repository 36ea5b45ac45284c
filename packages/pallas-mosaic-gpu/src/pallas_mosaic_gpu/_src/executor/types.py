"""MLIR types as numpy: element dtypes, vector shapes, and LLVM types' sizes/layouts."""

from __future__ import annotations

import functools
import re

import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir

from pallas.executor import (
    ExecutorError,
    ExecutorUnsupported,
    register_element_type,
    scalar_dtype,
    vshape,
)


class EmulationError(ExecutorError):
    """The generated code did something wrong at run time (an out-of-bounds access, a
    barrier wait that can never complete): a bug found by executing it."""


class EmulationUnsupported(ExecutorUnsupported):
    """The executor does not implement something the module uses (an op, a type): the
    conformance suite reports the case unsupported at level ``emulate``."""


ADDR = np.dtype(np.int64)  # pointers and ``index`` values
FOUR_BIT = (np.dtype(jnp.int4), np.dtype(jnp.uint4))  # int4/uint4: two a byte in memory
# LLVM pointers are int64 addresses for the shared rules too (llvm.select, ...).
register_element_type(lambda s: s.startswith("!llvm.ptr"), ADDR)


@functools.cache
def _scalar_dtype(s: str) -> np.dtype:
    """As :func:`pallas.executor.scalar_dtype`, but unsigned element types and ``i2``
    are unsupported (``i4`` is ml_dtypes' int4, packed two a byte in memory: see
    :mod:`subbyte`)."""
    if s == "index" or s.startswith("!llvm.ptr"):
        return ADDR
    if not s.startswith("ui") and s != "i2":
        try:
            return scalar_dtype(s)
        except ExecutorUnsupported:
            pass
    raise EmulationUnsupported(f"the Mosaic GPU executor has no numpy type for MLIR type {s}")


def dtype_of(t) -> np.dtype:
    """The numpy dtype of a scalar type or of a vector/memref type's elements
    (``i1`` is bool; signless integers are signed; ``index`` and pointers int64)."""
    if isinstance(t, (ir.VectorType, ir.MemRefType)):
        t = t.element_type
    return _scalar_dtype(str(t))


# -- LLVM types: size, alignment and struct layout, parsed from their text --------------


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _strip_llvm(s: str) -> str:
    s = s.strip()
    return s[len("!llvm."):] if s.startswith("!llvm.") else s


@functools.cache
def llvm_layout(s: str):
    """``(size, align, kind, parts)`` of an LLVM type given as text: ``kind`` is
    ``scalar`` (parts: dtype), ``array`` (parts: (n, element text)) or ``struct``
    (parts: tuple of (offset, field text))."""
    s = _strip_llvm(s)
    if s.startswith("ptr") or s == "index":
        return 8, 8, "scalar", ADDR
    if s.startswith("vector<"):
        m = re.fullmatch(r"vector<(\d+)x(\w+)>", s)
        if m is None:
            raise EmulationUnsupported(f"the Mosaic GPU executor has no layout for {s}")
        n, dt = int(m.group(1)), _scalar_dtype(m.group(2))
        if dt in FOUR_BIT and n % 2:
            raise EmulationUnsupported(f"the Mosaic GPU executor has no layout for {s}")
        size = n // 2 if dt in FOUR_BIT else n * dt.itemsize
        return size, 1 << (size - 1).bit_length(), "vector", (n, dt)
    if s.startswith("array<"):
        m = re.fullmatch(r"array<(\d+)\s*x\s*(.+)>", s)
        n, elem = int(m.group(1)), m.group(2)
        size, align, _, _ = llvm_layout(elem)
        return n * size, align, "array", (n, elem)
    if s.startswith("struct<"):
        inner = re.fullmatch(r"struct<\((.*)\)>", s).group(1)
        off, align, fields = 0, 1, []
        for f in _split_top(inner):
            fs, fa, _, _ = llvm_layout(f)
            off = -(-off // fa) * fa
            fields.append((off, f))
            off += fs
            align = max(align, fa)
        return -(-off // align) * align, align, "struct", tuple(fields)
    dt = _scalar_dtype(s)
    if dt in FOUR_BIT:
        raise EmulationUnsupported(f"the Mosaic GPU executor has no layout for a scalar {s} "
                                   f"in memory (only vectors of them, packed)")
    size = 1 if dt == np.bool_ else dt.itemsize
    return size, size, "scalar", dt


def llvm_size(t) -> int:
    return llvm_layout(str(t))[0]


def undef_of(s: str):
    """An undefined value of an LLVM aggregate type (None for scalars)."""
    _, _, kind, parts = llvm_layout(str(s))
    if kind == "struct":
        return tuple(undef_of(f) for _, f in parts)
    if kind == "array":
        n, elem = parts
        if llvm_layout(elem)[2] == "scalar":
            return np.zeros((1, n), llvm_layout(elem)[3])
        return tuple(undef_of(elem) for _ in range(n))
    return None


__all__ = ["ADDR", "EmulationError", "EmulationUnsupported", "dtype_of", "llvm_layout",
           "llvm_size", "undef_of", "vshape"]
