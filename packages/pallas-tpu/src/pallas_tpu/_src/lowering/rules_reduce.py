"""Lowering rules of reductions (sum, max, min, and, or, prod, argmax/argmin) and
matmuls (``dot_general``), in the forms Mosaic accepts."""

from __future__ import annotations

import jax.extend.core.primitives as P
import jax.numpy as jnp
import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, vector
from jaxlib.mosaic.python import tpu

from pallas_tpu._src.enums import MosaicUnsupported
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import (
    aval_in,
    aval_out,
    broadcast_to,
    cmpf,
    cmpi,
    const,
    convert,
    is_narrow_int,
    kind,
    materialize,
    narrow_int,
    widen_int,
)
from pallas_tpu._src.lowering.engine import rule

_REDUCE = {P.reduce_sum_p: "add", P.reduce_max_p: "max", P.reduce_min_p: "min",
           P.reduce_and_p: "and", P.reduce_or_p: "or", P.reduce_prod_p: "mul"}


@rule(*_REDUCE)
def _reduce(lctx, eqn, x):
    """Reductions Mosaic can do: in f32/bf16 or i32 (bools and narrow integers widened
    to i32, unsigned 32-bit max/min through a sign flip), from the neutral element."""
    src, out = aval_in(eqn, 0), aval_out(eqn)
    v = materialize(x, src)
    axes = list(eqn.params["axes"])
    name = _REDUCE[eqn.primitive]
    k = kind(src.dtype)
    if k == "f":
        kname, init = {"add": ("add", 0), "max": ("maximumf", -np.inf),
                       "min": ("minimumf", np.inf), "mul": ("mul", 1)}[name]
        return multi_reduction(kname, v, src.shape, src.dtype, axes, init)
    i32 = jnp.int32
    if k == "b" or is_narrow_int(src.dtype, src.shape):
        v = widen_int(v, src.shape, src.dtype, zero_extend=k == "b")
    flip = k == "u" and not is_narrow_int(src.dtype, src.shape) and name in ("max", "min")
    sign = const(src.shape, i32, np.iinfo(np.int32).min)
    if flip:  # unsigned order is signed order with the sign bit flipped
        v = arith.xori(v, sign)
    if k == "b":
        name = {"and": "min", "or": "max"}.get(name, name)
    kname, init = {"add": ("add", 0), "mul": ("mul", 1), "and": ("and", -1), "or": ("or", 0),
                   "max": ("maxsi", np.iinfo(np.int32).min),
                   "min": ("minsi", np.iinfo(np.int32).max)}[name]
    r = multi_reduction(kname, v, src.shape, i32, axes, init)
    if flip:
        r = arith.xori(r, const(out.shape, i32, np.iinfo(np.int32).min))
    if k == "b":
        return cmpi("ne", r, const(out.shape, i32, 0))
    if jnp.dtype(src.dtype).itemsize < 4:
        return narrow_int(r, out.shape, src.dtype)
    return r


def multi_reduction(kname, v, shape, dtype, axes, init):
    """``vector.multi_reduction`` of ``v`` over ``axes``. Mosaic reduces vectors to
    vectors only: a reduction to a scalar reduces to ``vector<1>`` (the leading axes,
    then the last one) and extracts the element. Products, which Mosaic does not
    reduce ("unsupported kind"), multiply halves (:func:`_product`)."""
    if kname == "mul":
        return _product(v, shape, dtype, axes)
    kattr = ir.Attribute.parse(f"#vector.kind<{kname}>")
    rest = tuple(n for i, n in enumerate(shape) if i not in axes)
    if rest:
        return vector.multi_reduction(kattr, v, const(rest, dtype, init), list(axes))
    n = len(shape)
    if n > 1:
        v = vector.multi_reduction(kattr, v, const(shape[-1:], dtype, init),
                                   list(range(n - 1)))
    v = vector.shape_cast(T.value_type((1, shape[-1]), dtype), v)
    v = vector.multi_reduction(kattr, v, const((1,), dtype, init), [1])
    return vector.extract(v, [], [0])


def _product(v, shape, dtype, axes):
    """The product over ``axes`` by halving: each step multiplies the low half of an
    axis by its high half (an odd last element is multiplied in at the end)."""
    mul = arith.mulf if kind(dtype) == "f" else arith.muli
    shape = list(shape)

    def part(x, axis, start, size):
        sizes = list(shape)
        sizes[axis] = size
        offsets = [0] * len(shape)
        offsets[axis] = start
        return vector.extract_strided_slice(T.value_type(tuple(sizes), dtype), x, offsets,
                                            sizes, [1] * len(shape))

    for axis in axes:
        leftover = None
        while shape[axis] > 1:
            n, h = shape[axis], shape[axis] // 2
            if n % 2:
                last = part(v, axis, n - 1, 1)
                leftover = last if leftover is None else mul(leftover, last)
            lo, hi = part(v, axis, 0, h), part(v, axis, h, h)
            shape[axis] = h
            v = mul(lo, hi)
        if leftover is not None:
            v = mul(v, leftover)
    rest = tuple(n for i, n in enumerate(shape) if i not in axes)
    if not rest:
        return vector.extract(v, [], [0] * len(shape))
    return vector.shape_cast(T.value_type(rest, dtype), v)


def _matvec(x, y, lhs_aval, rhs_aval, lc, rc, out):
    """A matrix-vector (or vector-matrix) product: the vector broadcast along the
    matrix's other axis, multiplied elementwise and summed over the contracted axis in
    the 32-bit accumulation type (the MXU takes no 1-D operand)."""
    mat_is_lhs = len(lhs_aval.shape) == 2
    mat, vec = (x, y) if mat_is_lhs else (y, x)
    mat_aval, vec_aval = (lhs_aval, rhs_aval) if mat_is_lhs else (rhs_aval, lhs_aval)
    axis = lc if mat_is_lhs else rc
    acc = jnp.float32 if kind(out.dtype) == "f" else jnp.int32
    shape = tuple(mat_aval.shape)
    m = convert(materialize(mat, mat_aval), shape, mat_aval.dtype, acc)
    v = convert(materialize(vec, vec_aval), vec_aval.shape, vec_aval.dtype, acc)
    along = (1, shape[1]) if axis == 1 else (shape[0], 1)
    v = broadcast_to(vector.shape_cast(T.value_type(along, acc), v), shape, acc)
    prod = (arith.mulf if acc == jnp.float32 else arith.muli)(m, v)
    red = multi_reduction("add", prod, shape, acc, [axis], 0)
    return convert(red, out.shape, acc, out.dtype)


@rule(P.dot_general_p)
def _dot_general(lctx, eqn, x, y):
    lhs_aval, rhs_aval, out = aval_in(eqn, 0), aval_in(eqn, 1), aval_out(eqn)
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    nl, nr = len(lhs_aval.shape), len(rhs_aval.shape)
    for a in (lhs_aval, rhs_aval):
        if kind(a.dtype) == "u":
            # Upstream's words (users match them); a NotImplementedError, as upstream's.
            raise MosaicUnsupported(
                f"Unsigned integer dtype {jnp.dtype(a.dtype).name} is not supported for "
                "dot_general (matmul) on the Mosaic TPU backend: the MXU reads integer "
                "operands as signed; cast to a signed type before the dot")
    if not lb and len(lc) == 1 and sorted((nl, nr)) == [1, 2]:
        return _matvec(x, y, lhs_aval, rhs_aval, lc[0], rc[0], out)
    if len(lc) != 1 or len(rc) != 1 or nl - len(lb) != 2 or nr - len(rb) != 2:
        raise NotImplementedError(
            f"dot_general of shapes {lhs_aval.shape} x {rhs_aval.shape} with dimension "
            f"numbers {eqn.params['dimension_numbers']}: Mosaic TPU matmuls contract one "
            f"dimension of 2-D operands (plus optional leading batch dimensions)"
        )
    if lb != tuple(range(len(lb))) or rb != tuple(range(len(rb))):
        raise NotImplementedError("dot_general whose batch dimensions are not leading")
    for a in (lhs_aval, rhs_aval):
        dt = jnp.dtype(a.dtype)
        if dt.kind in "iu" and dt.itemsize > 1:
            raise MosaicUnsupported(
                f"dot_general of {dt.name} operands ({lhs_aval.str_short()} x "
                f"{rhs_aval.str_short()}): the TPU MXU multiplies floats (f32, bf16) and "
                f"8-bit integers, not {dt.name} ('Bad lhs/rhs type' from Mosaic on v5e and "
                f"v6e); cast the operands to int8 or float32")
    lhs = materialize(x, lhs_aval)
    rhs = materialize(y, rhs_aval)
    lhs_nc = [d for d in range(nl) if d not in lc and d not in lb]
    rhs_nc = [d for d in range(nr) if d not in rc and d not in rb]
    order = [f"0, {d}" for d in lb] + [f"0, {lhs_nc[0]}", f"1, {rhs_nc[0]}"]
    dn = ir.Attribute.parse(
        f"#tpu.dot_dimension_numbers<[{lc[0]}], [{rc[0]}], [{lhs_nc[0]}], [{rhs_nc[0]}], "
        f"[{', '.join(order)}], [{', '.join(map(str, lb))}], [{', '.join(map(str, rb))}]>"
    )
    # Mosaic accumulates in 32 bits; narrower results are converted afterwards.
    acc_dtype = out.dtype
    if jnp.dtype(out.dtype).itemsize < 4:
        acc_dtype = jnp.float32 if kind(out.dtype) == "f" else jnp.int32
    acc = const(out.shape, acc_dtype, 0)
    precision = eqn.params.get("precision")
    prec_attr = None
    # fp32 contract precision is for f32 operands; Mosaic rejects it for narrower ones
    # ("Bad lhs type"), whose products are exact in f32 anyway.
    f32_operands = all(jnp.dtype(a.dtype) == jnp.float32 for a in (lhs_aval, rhs_aval))
    if precision is not None and f32_operands:
        p = precision[0] if isinstance(precision, tuple) else precision
        if str(p) in ("HIGHEST", "Precision.HIGHEST"):
            prec_attr = ir.Attribute.parse("#tpu.contract_precision<fp32>")
    # The lhs contracted along its second-minor axis is a transposed lhs: Mosaic may
    # fuse that transpose into the matmul when the kernel's params ask.
    hint = lctx.fuse_transposed_lhs and lc[0] == nl - 2
    res = tpu.matmul(T.value_type(out.shape, acc_dtype), lhs, rhs, acc, hint,
                     dimension_numbers=dn, precision=prec_attr)
    return convert(res, out.shape, acc_dtype, out.dtype)


@rule(P.argmax_p, P.argmin_p)
def _argminmax(lctx, eqn, x):
    """argmax/argmin as: the smallest index where the value equals the max/min."""
    src, out = aval_in(eqn, 0), aval_out(eqn)
    (axis,) = eqn.params["axes"]
    if jnp.dtype(out.dtype) != jnp.int32:
        raise NotImplementedError(f"{eqn.primitive.name} with index dtype {out.dtype}")
    v = materialize(x, src)
    is_max = eqn.primitive is P.argmax_p
    k, dt = kind(src.dtype), src.dtype
    if k == "f":
        if jnp.dtype(dt) != jnp.float32:
            # bf16 in f32 (exact): on v6e a bf16 max broadcast back for the compare is
            # an "Invalid relayout" for Mosaic.
            v, dt = convert(v, src.shape, dt, jnp.float32), jnp.float32
        kname, init = ("maximumf", -np.inf) if is_max else ("minimumf", np.inf)
    elif k in "iu":
        # In i32 (Mosaic reduces no narrower integers, and no unsigned ones: unsigned
        # order is signed order with the sign bit flipped).
        if is_narrow_int(dt, src.shape):
            v = widen_int(v, src.shape, dt)
        elif k == "u":
            v = arith.xori(v, const(src.shape, jnp.int32, np.iinfo(np.int32).min))
        dt, info = jnp.int32, np.iinfo(np.int32)
        kname, init = ("maxsi", info.min) if is_max else ("minsi", info.max)
    else:
        raise NotImplementedError(f"{eqn.primitive.name} of {src.dtype}")
    shape, axes = tuple(src.shape), [axis]
    if len(shape) == 1:
        # In 2D (1, n): Mosaic has no iota below rank 2 ("iota rank below 2D
        # unsupported"); the index is then reduced over both axes to the scalar.
        shape, axis, axes = (1, shape[0]), 1, [0, 1]
        v = vector.shape_cast(T.value_type(shape, dt), v)
    best = multi_reduction(kname, v, shape, dt, [axis], init)
    keep = list(shape)
    keep[axis] = 1
    best = broadcast_to(vector.shape_cast(T.value_type(tuple(keep), dt), best)
                        if len(shape) > 1 else best, shape, dt)
    eq = (cmpf(arith.CmpFPredicate.OEQ, v, best) if k == "f"
          else cmpi(arith.CmpIPredicate.eq, v, best))
    idx = tpu.iota(T.value_type(shape, jnp.int32), [axis])
    big = const(shape, jnp.int32, shape[axis])
    cand = arith.select(eq, idx, big)
    # Mosaic takes only the neutral element (INT32_MAX for minsi) as the accumulator.
    return multi_reduction("minsi", cand, shape, jnp.int32, axes, np.iinfo(np.int32).max)
