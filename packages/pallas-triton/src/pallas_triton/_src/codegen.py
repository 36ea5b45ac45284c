"""The pieces every lowering rule uses: values, refs, the source emitter and dtype names.

The lowering produces ``triton.language`` Python source text, one line at a time, the
way PyTorch Inductor does: the same text is compiled by ``triton.compile`` for a GPU and
run by Triton's interpreter on CPU.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

BACKEND = "triton"

_TL_DTYPES = {
    "bool": "tl.int1",
    "int8": "tl.int8",
    "int16": "tl.int16",
    "int32": "tl.int32",
    "int64": "tl.int64",
    "uint8": "tl.uint8",
    "uint16": "tl.uint16",
    "uint32": "tl.uint32",
    "uint64": "tl.uint64",
    "float16": "tl.float16",
    "bfloat16": "tl.bfloat16",
    "float32": "tl.float32",
    "float64": "tl.float64",
    "float8_e4m3fn": "tl.float8e4nv",
    "float8_e5m2": "tl.float8e5",
}

# Triton's signature strings for pointer arguments.
_SIG_DTYPES = {
    "bool": "i1",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5",
}


class TritonLoweringError(NotImplementedError):
    """Raised at lowering time for what the Triton backend cannot express."""


def unsupported(what: str, alternative: str | None = None) -> TritonLoweringError:
    msg = f"{what} is not supported by the Pallas Triton backend (pallas-triton)"
    if alternative:
        msg += f"; {alternative}"
    return TritonLoweringError(msg + ".")


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _dtype_in(table: dict[str, str], dtype) -> str:
    """``dtype``'s entry in ``table``; a dtype the backend has no name for is refused."""
    name = dtype_name(dtype)
    try:
        return table[name]
    except KeyError:
        raise unsupported(f"dtype {name}") from None


def tl_dtype(dtype) -> str:
    """The ``triton.language`` dtype (``tl.float32``) of ``dtype``."""
    return _dtype_in(_TL_DTYPES, dtype)


def sig_dtype(dtype) -> str:
    """The dtype's name in a kernel signature (``fp32``), as ``triton.compile`` takes it."""
    return _dtype_in(_SIG_DTYPES, dtype)


def is_float(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating) or dtype_name(dtype) == "bfloat16"


def is_signed_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.signedinteger)


def is_unsigned_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.unsignedinteger)


def is_bool(dtype) -> bool:
    return np.dtype(dtype) == np.bool_


def is_pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def check_pow2(shape, what: str) -> None:
    for n in shape:
        if not is_pow2(int(n)):
            raise TritonLoweringError(
                f"{what} has shape {tuple(shape)}; the Pallas Triton backend (pallas-triton) "
                f"needs every block and slice dimension to be a power of two (Triton's "
                f"tl.arange requires it). Use a power-of-two block shape (edge blocks are "
                f"masked), or run with interpret=True."
            )


def py_scalar(value, dtype) -> str:
    """Python source for a scalar constant (a Python literal, typed by the context)."""
    v = np.asarray(value).item()
    if is_bool(dtype):
        return "True" if v else "False"
    if is_float(dtype):
        v = float(v)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return repr(int(v))


@dataclasses.dataclass
class Value:
    """A value in the generated source: an expression plus JAX's shape and dtype."""

    expr: str
    shape: tuple[int, ...]
    dtype: Any
    literal: bool = False
    # A scan's stacked rows padded to a power of two: only its first ``rows`` rows are
    # JAX's value (``shape[0]`` is the padded count); only ``scan`` may read it.
    rows: int | None = None

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    def __repr__(self) -> str:
        return f"Value({self.expr}: {dtype_name(self.dtype)}{list(self.shape)})"


@dataclasses.dataclass
class ArrayDim:
    """One array dimension of a pointer-backed ref: where the block starts, and masks."""

    start: str  # element offset of the block in the array (source expression)
    size: int  # block size (1 for squeezed)
    extent: int  # array size along this dimension
    squeezed: bool = False
    mask_lo: bool = False  # the block may start before 0 (Element padding)
    mask_hi: bool = False  # the block may run past the end (edge blocks)
    bound: str | None = None  # BoundedSlice: the valid size within the block


@dataclasses.dataclass
class GlobalRef:
    """A ref backed by global memory: a pointer argument plus the block it sees."""

    ptr: str
    dtype: Any
    strides: tuple[int, ...]  # element strides of the whole array
    dims: list[ArrayDim]
    origin: str
    # The parallel grid axes along which concurrently running programs see this same
    # (output) block: only atomics may touch it.
    shared_along: tuple[int, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims if not d.squeezed)


@dataclasses.dataclass
class LocalRef:
    """A ref held in registers: a scratch buffer or ``run_scoped`` allocation."""

    var: str
    shape: tuple[int, ...]
    dtype: Any
    origin: str


class Emitter:
    """Accumulates indented source lines and hands out fresh names."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 1
        self._counter = 0
        self.helpers: dict[str, str] = {}  # module-level @triton.jit helpers, by name
        self.externs: dict[str, str] = {}  # module-level @tl.core.extern functions

    def helper(self, name: str, source: str) -> str:
        """Adds a module-level ``@triton.jit`` function (e.g. a reduction's combiner)."""
        self.helpers.setdefault(name, source)
        return name

    def extern(self, name: str, source: str) -> str:
        """Adds a module-level ``@tl.core.extern`` function (a device library call
        Triton's ``libdevice`` lacks for the target, e.g. AMD's OCML ``cbrt``)."""
        self.externs.setdefault(name, source)
        return name

    def fresh(self, prefix: str = "v") -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def assign(self, expr: str, shape, dtype, prefix: str = "v") -> Value:
        name = self.fresh(prefix)
        self.line(f"{name} = {expr}")
        return Value(name, tuple(shape), dtype)

    def indent(self):
        emitter = self

        class _Block:
            def __enter__(self):
                emitter.depth += 1
                return emitter

            def __exit__(self, *exc):
                emitter.depth -= 1

        return _Block()


def typed(em: Emitter, v: Value) -> Value:
    """Makes a literal into a typed Triton value (needed for loop carries and branches)."""
    if not v.literal:
        return v
    if v.shape:
        return em.assign(f"tl.full({list(v.shape)}, {v.expr}, {tl_dtype(v.dtype)})",
                         v.shape, v.dtype)
    return em.assign(f"tl.full([], {v.expr}, {tl_dtype(v.dtype)})", (), v.dtype)


def literal_operand(v: Value) -> str:
    """Source for ``v`` as an operand of arithmetic: typed unless Triton's default fits."""
    if v.literal and dtype_name(v.dtype) not in ("float32", "int32", "bool"):
        return f"tl.full([], {v.expr}, {tl_dtype(v.dtype)})"
    return v.expr


def expand(expr: str, axis: int, rank: int) -> str:
    """``expr`` (1-D) indexed so that it varies along ``axis`` of a rank-``rank`` tensor."""
    if rank <= 1:
        return expr
    idx = ", ".join(":" if i == axis else "None" for i in range(rank))
    return f"({expr})[{idx}]"
