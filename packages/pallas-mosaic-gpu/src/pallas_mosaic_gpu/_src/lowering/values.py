"""Kernel values: MLIR element types, constants, and warpgroup arrays.

An array of rank >= 1 is a Mosaic GPU ``FragmentedArray`` spread over the 128 threads of
a warpgroup. The backend uses one register layout per shape (strided, with a vector
width chosen from the shape alone), so arrays of different dtypes but the same shape
line up register for register; a broadcast scalar is a splat until it meets an array.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith

from pallas import mlir_math
from pallas_mosaic_gpu._src.lowering.context import Lit, RefVal

FragmentedArray = mgpu.FragmentedArray
WARPGROUP_SIZE = 128


def bits(dtype) -> int:
    """The width of ``dtype``'s elements in bits: 4 for int4/uint4 (numpy gives them a
    whole byte of itemsize), 1 for bool."""
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_:
        return 1
    if jnp.issubdtype(dt, jnp.integer):
        return jnp.iinfo(dt).bits
    return dt.itemsize * 8


def elem_type(dtype) -> ir.Type:
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_ or jnp.issubdtype(dt, jnp.integer):  # int4/uint4 are i4
        return ir.IntegerType.get_signless(bits(dt))
    return {
        "float32": ir.F32Type.get, "float16": ir.F16Type.get, "bfloat16": ir.BF16Type.get,
        "float64": ir.F64Type.get, "float8_e4m3fn": ir.Float8E4M3FNType.get,
        "float8_e5m2": ir.Float8E5M2Type.get,
    }[dt.name]()


def storage_dtype(dtype):
    """The dtype an operand of ``dtype`` has in memory: bool is stored as int8 (one byte
    per element, as XLA stores ``pred``); others as themselves."""
    dt = jnp.dtype(dtype)
    return jnp.dtype(jnp.int8) if dt == jnp.bool_ else dt


def signed(dtype) -> bool | None:
    """FragmentedArray's ``is_signed``: None for floats, else whether the ints are signed."""
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_:
        return False
    if jnp.issubdtype(dt, jnp.integer):  # int4/uint4 too (ml_dtypes: numpy kind "V")
        return bool(jnp.issubdtype(dt, jnp.signedinteger))
    return None


def kind(dtype) -> str:
    """``"f"`` (floats), ``"i"`` (signed), ``"u"`` (unsigned) or ``"b"`` (bool)."""
    dt = jnp.dtype(dtype)
    if dt == jnp.bool_:
        return "b"
    if jnp.issubdtype(dt, jnp.integer):  # int4/uint4 too (ml_dtypes: numpy kind "V")
        return "i" if jnp.issubdtype(dt, jnp.signedinteger) else "u"
    return "f"


def i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def index() -> ir.Type:
    return ir.IndexType.get()


def const(value, ty: ir.Type) -> ir.Value:
    """A constant of type ``ty`` (a scalar type, or a vector type as a splat)."""
    et = ir.VectorType(ty).element_type if isinstance(ty, ir.VectorType) else ty
    if isinstance(et, ir.IntegerType):
        width = ir.IntegerType(et).width
        v = int(value)
        if width == 1:
            v = int(bool(value))
        elif v >= 1 << (width - 1):
            v -= 1 << width  # signless attributes hold the two's-complement value
        attr = ir.IntegerAttr.get(et, v)
    elif isinstance(et, ir.IndexType):
        attr = ir.IntegerAttr.get(et, int(value))
    else:
        attr = ir.FloatAttr.get(et, float(value))
    if isinstance(ty, ir.VectorType):
        attr = ir.DenseElementsAttr.get_splat(ty, attr)
    return arith.ConstantOp(ty, attr).result


def const_like(value, like: ir.Value) -> ir.Value:
    return const(value, like.type)


def strided_layout(shape: tuple[int, ...]):
    """The register layout of every non-splat array of ``shape``."""
    n = math.prod(shape)
    if n % WARPGROUP_SIZE:
        raise NotImplementedError(
            f"arrays of shape {shape} ({n} elements): Mosaic GPU spreads an array over "
            f"the {WARPGROUP_SIZE} threads of a warpgroup, so its size must be a multiple "
            f"of {WARPGROUP_SIZE}")
    per_thread = n // WARPGROUP_SIZE
    vec = next(v for v in (8, 4, 2, 1) if per_thread % v == 0)
    return fa.WGStridedFragLayout(shape=tuple(shape), vec_size=vec)


def scalar(x, aval) -> ir.Value:
    """A rank-0 value as a scalar ``ir.Value`` (literals become constants)."""
    if isinstance(x, Lit):
        v = np.asarray(x.val)
        return const(v.reshape(-1)[0].item() if v.ndim else v.item(), elem_type(aval.dtype))
    if isinstance(x, FragmentedArray):
        if isinstance(x.layout, fa.WGSplatFragLayout):
            return x.registers.item()
        raise NotImplementedError("a warpgroup array used where a scalar is expected")
    if isinstance(x, RefVal):
        raise TypeError("a ref was used where a value was expected")
    if hasattr(x, "values") and not isinstance(x, ir.Value):  # a one-element Small array
        if x.values.size == 1:
            return x.values.flat[0]
        raise NotImplementedError("an array used where a scalar is expected")
    return x


def splat(value: ir.Value, shape, dtype) -> FragmentedArray:
    return FragmentedArray.splat(value, tuple(shape), is_signed=signed(dtype))


def array(x, aval, shape=None) -> FragmentedArray:
    """``x`` (array, scalar or literal) as a FragmentedArray of ``shape`` (default: its
    own); scalars and literals become splats."""
    shape = tuple(aval.shape if shape is None else shape)
    if isinstance(x, FragmentedArray):
        if x.shape != shape:
            if isinstance(x.layout, fa.WGSplatFragLayout):
                return splat(x.registers.item(), shape, aval.dtype)
            raise NotImplementedError(f"broadcasting a {x.shape} array to {shape}")
        return x
    if isinstance(x, Lit) and np.ndim(x.val):
        v = np.asarray(x.val)
        if not np.all(v == v.reshape(-1)[0]):
            raise NotImplementedError("non-splat array constants in kernels")
    return splat(scalar(x, aval), shape, aval.dtype)


def to_strided(x: FragmentedArray) -> FragmentedArray:
    """``x`` in the strided layout of its shape (splats are broadcast into registers)."""
    layout = strided_layout(x.shape)
    if x.layout == layout:
        return x
    if isinstance(x.layout, fa.WGSplatFragLayout):
        return FragmentedArray.splat(x.registers.item(), x.shape, layout,
                                     is_signed=x.is_signed)
    if isinstance(x.layout, fa.WGStridedFragLayout):
        # A thread owns different elements at another vector width: that needs an
        # exchange through shared memory, which is not emitted yet.
        raise NotImplementedError(
            f"changing the vector width of a {x.shape} array from {x.layout.vec_size} "
            f"to {layout.vec_size}")
    return x.to_layout(layout)


def map_registers(fn, arrays: list[FragmentedArray], out_dtype) -> FragmentedArray:
    """Applies ``fn`` (over scalar or vector ``ir.Value``) register by register."""
    layouts = [a.layout for a in arrays if not isinstance(a.layout, fa.WGSplatFragLayout)]
    if layouts and all(isinstance(x, fa.TiledLayout) and x == layouts[0] for x in layouts):
        # Arrays in one tiled layout (say, WGMMA's) stay in it; splats join them.
        arrays = [a if a.layout == layouts[0] else FragmentedArray.splat(
            a.registers.item(), a.shape, layouts[0], is_signed=a.is_signed) for a in arrays]
    elif layouts:
        arrays = [to_strided(a) for a in arrays]
    layout = arrays[0].layout
    regs = np.empty_like(arrays[0].registers)
    for idx in np.ndindex(regs.shape):
        regs[idx] = fn(*(a.registers[idx] for a in arrays))
    return FragmentedArray(_registers=regs, _layout=layout, _is_signed=signed(out_dtype))


def with_elem_type(ty: ir.Type, et: ir.Type) -> ir.Type:
    """``ty`` (scalar or vector type) with element type ``et``."""
    if isinstance(ty, ir.VectorType):
        return ir.VectorType.get(ir.VectorType(ty).shape, et)
    return et


def convert(v: ir.Value, src, dst) -> ir.Value:
    """Converts a scalar or vector ``ir.Value`` from dtype ``src`` to ``dst``."""
    s, d = jnp.dtype(src), jnp.dtype(dst)
    if s == d:
        return v

    def nonzero(x):
        zero = const_like(0, x)
        if kind(s) == "f":
            return arith.cmpf(arith.CmpFPredicate.UNE, x, zero)
        return arith.cmpi(arith.CmpIPredicate.ne, x, zero)

    return mlir_math.convert(v, with_elem_type(v.type, elem_type(d)), (kind(s), bits(s)),
                             (kind(d), bits(d)), nonzero=nonzero,
                             f32_type=with_elem_type(v.type, ir.F32Type.get()))
