"""Shared emission helpers of the Mosaic lowering rules: constants, casts, broadcasts
and index conversions (the rule table is the engine's)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, vector
from jaxlib.mosaic.python import tpu

import pallas as pl
from pallas import mlir_math
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.values import Lit, RefVal
from pallas_tpu._src.memory import MemorySpace

# ------------------------------------------------------------------------------------------
# Comparisons Mosaic accepts.

_UNORDERED = {  # an unordered predicate is the negation of an ordered one
    "UNE": "OEQ", "UEQ": "ONE", "ULT": "OGE", "ULE": "OGT", "UGT": "OLE", "UGE": "OLT",
}
_SIGNED = {"slt", "sle", "sgt", "sge"}


def _shape_of(v: ir.Value) -> tuple:
    t = v.type
    return tuple(ir.VectorType(t).shape) if isinstance(t, ir.VectorType) else ()


def _not(v: ir.Value) -> ir.Value:
    true = arith.ConstantOp(v.type, T.splat_attr(v.type, True, jnp.bool_)).result
    return arith.xori(v, true)


def cmpf(pred, a: ir.Value, b: ir.Value) -> ir.Value:
    """``arith.cmpf`` with Mosaic's ordered predicates only: it rejects the unordered
    ones ("Unsupported comparison direction: une"), which are the ordered ones negated
    (``uno`` is "either is NaN")."""
    name = str(pred).split(".")[-1].upper() if not isinstance(pred, str) else pred.upper()
    if name == "UNO":
        return _not(arith.andi(cmpf("OEQ", a, a), cmpf("OEQ", b, b)))
    if name == "ORD":
        return arith.andi(cmpf("OEQ", a, a), cmpf("OEQ", b, b))
    if name in _UNORDERED:
        return _not(cmpf(_UNORDERED[name], a, b))
    return arith.cmpf(getattr(arith.CmpFPredicate, name), a, b)


def cmpi(pred, a: ir.Value, b: ir.Value) -> ir.Value:
    """``arith.cmpi``, on 32-bit integers: Mosaic compares no 1-bit vectors and, on
    v5e/v6e, no 8- or 16-bit ones ("Target does not support this comparison"), so
    narrower operands are widened first (sign- or zero-extended as the predicate reads
    them)."""
    name = str(pred).split(".")[-1].lower() if not isinstance(pred, str) else pred.lower()
    et = a.type.element_type if isinstance(a.type, ir.VectorType) else a.type
    width = ir.IntegerType(et).width
    if width == 1:  # as logic (a widened compare is folded back to an i1 one)
        if name in ("eq", "ne"):
            x = arith.xori(a, b)
            return _not(x) if name == "eq" else x
        if name in ("ult", "slt", "ugt", "sgt"):  # false < true (unsigned)
            lo, hi = (a, b) if name[1:] == "lt" else (b, a)
            if name[0] == "s":  # signed i1: true is -1 < 0
                lo, hi = hi, lo
            return arith.andi(_not(lo), hi)
        lo, hi = (a, b) if name[1:] == "le" else (b, a)
        if name[0] == "s":
            lo, hi = hi, lo
        return arith.ori(_not(lo), hi)
    if width < 32 and _shape_of(a):
        t = T.value_type(_shape_of(a), jnp.int32)
        ext = arith.extsi if name in _SIGNED else arith.extui
        a, b = ext(t, a), ext(t, b)
    return arith.cmpi(getattr(arith.CmpIPredicate, name), a, b)


# ------------------------------------------------------------------------------------------
# Values.


def aval_in(eqn, i):
    return eqn.invars[i].aval


def aval_out(eqn, i=0):
    return eqn.outvars[i].aval


def const(shape, dtype, value) -> ir.Value:
    t = T.value_type(shape, dtype)
    return arith.ConstantOp(t, T.splat_attr(t, value, dtype)).result


def materialize(x, aval) -> ir.Value:
    """An ir.Value for ``x`` (a literal becomes a constant of ``aval``'s type)."""
    if isinstance(x, Lit):
        v = np.asarray(x.val)
        if v.ndim and not np.all(v == v.reshape(-1)[0]):
            raise NotImplementedError("non-splat array constants in kernels")
        return const(aval.shape, aval.dtype, v.reshape(-1)[0] if v.ndim else v.item())
    if isinstance(x, RefVal):
        raise TypeError("a ref was used where a value was expected")
    return x


def broadcast_to(x: ir.Value, shape, dtype) -> ir.Value:
    if not shape:
        return x
    t = T.value_type(shape, dtype)
    if x.type == t:
        return x
    if isinstance(x.type, ir.VectorType):
        src = tuple(ir.VectorType(x.type).shape)
        if len(src) < len(shape):
            x = vector.shape_cast(T.value_type((1,) * (len(shape) - len(src)) + src, dtype), x)
    return vector.broadcast(t, x)


def operands(eqn, invals):
    """Materialised operands broadcast to the output shape (scalars splat)."""
    shape = aval_out(eqn).shape
    out = []
    for i, x in enumerate(invals):
        a = aval_in(eqn, i)
        v = materialize(x, a)
        if a.shape != shape and shape:
            v = broadcast_to(v, shape, a.dtype)
        out.append(v)
    return out


def is_narrow_int(dtype, shape) -> bool:
    """Whether values of ``dtype`` and ``shape`` are 8/16-bit integer vectors, on which
    Mosaic does no arithmetic on v5e/v6e ("Only vector<i32> ... are supported"): the
    lowering computes them in i32 and truncates (wrapping as the narrow op would)."""
    dt = jnp.dtype(dtype)
    return bool(shape) and dt.kind in "iu" and dt.itemsize < 4


def widen_int(v: ir.Value, shape, dtype, zero_extend: bool = False) -> ir.Value:
    """A narrow integer vector as i32 (sign- or zero-extended as its dtype reads)."""
    t = T.value_type(shape, jnp.int32)
    if jnp.dtype(dtype).kind == "u" or zero_extend:
        return arith.extui(t, v)
    return arith.extsi(t, v)


def narrow_int(v: ir.Value, shape, dtype) -> ir.Value:
    return arith.trunci(T.value_type(shape, dtype), v)


def kind(dtype) -> str:
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_:
        return "b"
    if dt.kind in "iu":
        return dt.kind
    if dt.name in ("int4", "uint4"):  # ml_dtypes' kind is 'V'
        return dt.name[0]
    return "f"


def convert(v, shape, src_dtype, dst_dtype):
    s, d = jnp.dtype(src_dtype), jnp.dtype(dst_dtype)
    if s == d or (T.elem_type(s) == T.elem_type(d) and kind(s) == kind(d)):
        return v  # (f16 is f32 in the kernel)

    def width(dt):  # as the kernel holds it: f16 is f32, int4 is i4
        return T.memory_dtype(dt).itemsize * 8 if kind(dt) == "f" else int_bits(dt)

    def nonzero(x):
        zero = const(shape, s, 0)
        return cmpf("UNE", x, zero) if kind(s) == "f" else cmpi("ne", x, zero)

    return mlir_math.convert(v, T.value_type(shape, d), (kind(s), width(s)),
                             (kind(d), width(d)), nonzero=nonzero,
                             f32_type=T.value_type(shape, jnp.float32))


def int_bits(dtype) -> int:
    """The width of an integer (or bool) dtype in the kernel: int4/uint4 are i4 although
    numpy holds them a byte each."""
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_:
        return 1
    return 4 if dt.name in ("int4", "uint4") else dt.itemsize * 8


def to_index(x, aval=None) -> ir.Value:
    if isinstance(x, Lit):
        return arith.constant(T.index(), int(np.asarray(x.val)))
    if isinstance(x, int | np.integer):
        return arith.constant(T.index(), int(x))
    if isinstance(x.type, ir.IndexType):
        return x
    return arith.index_cast(T.index(), x)


def to_i32(x) -> ir.Value:
    if isinstance(x, Lit):
        return arith.constant(T.i32(), int(np.asarray(x.val)))
    if isinstance(x, int | np.integer):
        return arith.constant(T.i32(), int(x))
    if isinstance(x.type, ir.IndexType):
        return arith.index_cast(T.i32(), x)
    return x


def alloc_scratch(mt: ir.MemRefType, space) -> ir.Value:
    """A buffer allocated inside the kernel (``run_scoped``, ``jax.empty_ref``). Under
    ``pl.enable_poison_buffers`` (or JAX's ``jax_pallas_poison_buffers``, as upstream) a
    VMEM or scalar buffer starts poisoned, as upstream's lowering does: NaN for floats,
    the most negative value for integers (so a bool, stored as int32, reads True)."""
    if T.is_semaphore(space):
        return tpu.sem_alloc(mt)
    m = memref.alloca(mt, [], [])
    if pl.enable_poison_buffers.value and (not mt.shape or space is MemorySpace.VMEM):
        et = mt.element_type
        if isinstance(et, ir.FloatType):
            val = arith.constant(et, ir.FloatAttr.get(et, float("nan")))
        else:
            val = arith.constant(et, ir.IntegerAttr.get(et, -(1 << (et.width - 1))))
        if not mt.shape:
            memref.store(val, m, [])
        else:
            zero = arith.constant(ir.IndexType.get(), 0)
            vector.store(vector.broadcast(ir.VectorType.get(mt.shape, et), val), m,
                         [zero] * len(mt.shape))
    return m


def iota(shape, dim: int, dtype=jnp.int32) -> ir.Value:
    """``tpu.iota`` of a 32-bit integer ``dtype`` along ``dim``; a rank-1 iota is made in
    2-D, ``(1, n)``, and reshaped (Mosaic has no iota below rank 2)."""
    if len(shape) == 1:
        v = tpu.iota(T.value_type((1, shape[0]), dtype), [1])
        return vector.shape_cast(T.value_type(tuple(shape), dtype), v)
    return tpu.iota(T.value_type(tuple(shape), dtype), [dim])

