"""Lowering rules of elementwise operations: arithmetic, comparisons, bitwise and
shift operations, transcendental functions, casts and selects.

Each rule builds one function over ``ir.Value`` (a scalar, or one register: a vector of
a warpgroup array) and :func:`pointwise` applies it to every register.
Transcendental functions of 16-bit floats are computed in float32, as XLA does.
"""

from __future__ import annotations

import functools

import jax.extend.core.primitives as P
import jax.numpy as jnp
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, llvm, vector
from jaxlib.mlir.dialects import math as mmath

from pallas.mlir_math import erf_inv, integer_pow
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import rule
from pallas_mosaic_gpu._src.lowering.register_layouts import in_layout

CF, CI = arith.CmpFPredicate, arith.CmpIPredicate


def pointwise(eqn, invals, fn):
    """Lowers an elementwise eqn with ``fn`` over ir.Values (scalar or vector)."""
    out = eqn.outvars[0].aval
    avals = [v.aval for v in eqn.invars]
    if not out.shape:
        return fn(*(V.scalar(x, a) for x, a in zip(invals, avals)))
    tiled = next((x.layout for x in invals if isinstance(x, V.FragmentedArray)
                  and isinstance(x.layout, V.fa.TiledLayout)), None)
    if tiled is not None:  # arrays in a tiled layout (say, WGMMA's) stay in it
        shape = tuple(out.shape)
        if any(a.shape and tuple(a.shape) != shape for a in avals):
            raise NotImplementedError(
                f"{eqn.primitive.name} of arrays of shapes {[tuple(a.shape) for a in avals]} "
                f"in the register layout {tiled} (broadcast them to {shape} first, e.g. "
                "with lax.broadcast_in_dim)")
        arrays = [in_layout(x, a.update(shape=shape), tiled) for x, a in zip(invals, avals)]
        return V.map_registers(fn, arrays, out.dtype)
    # Operands with size-1 dims stretch to the output's shape (as lax allows).
    shape = tuple(out.shape)
    invals = [small.stretch(x, a, shape) if a.shape and tuple(a.shape) != shape
              and tuple(getattr(x, "shape", ())) != shape else x
              for x, a in zip(invals, avals)]
    avals = [a.update(shape=tuple(out.shape)) if a.shape else a for a in avals]
    if small.is_small(out.shape):
        arrays = [small.to_small(x, a, out.shape) for x, a in zip(invals, avals)]
        return small.map_small(fn, arrays)
    arrays = [V.array(x, a, out.shape) for x, a in zip(invals, avals)]
    return V.map_registers(fn, arrays, out.dtype)


def _in_dtype(eqn, i=0):
    return eqn.invars[i].aval.dtype


def _per_element(op, *vals):
    """``op`` applied element by element: NVPTX has no vector form of some operations
    (``frem``), so vectors are split into scalars and rebuilt."""
    if not isinstance(vals[0].type, ir.VectorType):
        return op(*vals)
    vt = ir.VectorType(vals[0].type)
    n = vt.shape[0]
    parts = [op(*(vector.extract(v, [], [i]) for v in vals)) for i in range(n)]
    return vector.from_elements(ir.VectorType.get([n], parts[0].type), parts)


def _binary(f_op, i_op, u_op=None):
    def lower(lctx, eqn, a, b):
        k = V.kind(_in_dtype(eqn))
        op = f_op if k == "f" else (u_op or i_op) if k in "ub" else i_op
        if op is None:
            raise NotImplementedError(f"{eqn.primitive.name} on {jnp.dtype(_in_dtype(eqn))}")
        return pointwise(eqn, [a, b], op)

    return lower


@rule(P.rem_p)
def _rem(lctx, eqn, a, b):
    """``lax.rem``; for floats, libdevice's ``fmod`` (NVPTX cannot lower ``frem``)."""
    dt = jnp.dtype(_in_dtype(eqn))
    if V.kind(dt) != "f":
        return _binary(None, arith.remsi, arith.remui)(lctx, eqn, a, b)

    def fmod(x, y):
        if dt.itemsize < 4:
            f32 = ir.F32Type.get()
            r = libdevice(lctx, "__nv_fmodf", [arith.extf(f32, x), arith.extf(f32, y)], f32)
            return arith.truncf(x.type, r)
        return libdevice(lctx, "__nv_fmodf", [x, y], x.type)

    return pointwise(eqn, [a, b], lambda x, y: _per_element(fmod, x, y))


def libdevice(lctx, fname: str, args, result_type):
    """Calls a libdevice function (declared once in the module; it is linked with the
    kernel when Mosaic GPU compiles it)."""
    module = lctx.launch_ctx.module
    table = ir.SymbolTable(module.operation)
    if fname not in table:
        sig = ", ".join(str(a.type) for a in args)
        fty = ir.TypeAttr.get(ir.Type.parse(f"!llvm.func<{result_type} ({sig})>"))
        with ir.InsertionPoint.at_block_begin(module.body):
            llvm.LLVMFuncOp(fname, fty, sym_visibility="private")
    # LLVM inlines libdevice; an inlined call needs a real location for the debug info.
    loc = ir.Location.file(lctx.name, 0, 0)
    return llvm.call(result_type, list(args), [], [], callee=fname, loc=loc)


def _contracting(op):
    """A float op LLVM may contract with its neighbours (``a * b + c`` into one FMA, as
    Mosaic GPU's own arithmetic allows: the precision only increases)."""
    return lambda a, b: op(a, b, fastmath=arith.FastMathFlags.contract)


for _p, _ops in {
    P.add_p: (_contracting(arith.addf), arith.addi),
    P.add_jaxvals_p: (_contracting(arith.addf), arith.addi),
    P.sub_p: (_contracting(arith.subf), arith.subi),
    P.mul_p: (_contracting(arith.mulf), arith.muli),
    P.div_p: (arith.divf, arith.divsi, arith.divui),
    P.max_p: (arith.maximumf, arith.maxsi, arith.maxui),
    P.min_p: (arith.minimumf, arith.minsi, arith.minui),
    P.and_p: (None, arith.andi),
    P.or_p: (None, arith.ori),
    P.xor_p: (None, arith.xori),
}.items():
    rule(_p)(_binary(*_ops))


def _compare(fpred, spred, upred):
    def lower(lctx, eqn, a, b):
        k = V.kind(_in_dtype(eqn))
        if k == "f":
            return pointwise(eqn, [a, b], lambda x, y: arith.cmpf(fpred, x, y))
        pred = spred if k == "i" else upred
        return pointwise(eqn, [a, b], lambda x, y: arith.cmpi(pred, x, y))

    return lower


for _p, _preds in {
    P.eq_p: (CF.OEQ, CI.eq, CI.eq), P.ne_p: (CF.UNE, CI.ne, CI.ne),
    P.lt_p: (CF.OLT, CI.slt, CI.ult), P.le_p: (CF.OLE, CI.sle, CI.ule),
    P.gt_p: (CF.OGT, CI.sgt, CI.ugt), P.ge_p: (CF.OGE, CI.sge, CI.uge),
}.items():
    rule(_p)(_compare(*_preds))


def _float_unary(op, upcast=True):
    """A float function; 16-bit floats are computed in float32."""

    def lower(lctx, eqn, x):
        if V.kind(_in_dtype(eqn)) != "f":
            raise NotImplementedError(f"{eqn.primitive.name} on {jnp.dtype(_in_dtype(eqn))}")
        if (lctx.approx_math and eqn.primitive in _APPROX and jnp.dtype(_in_dtype(eqn))
                == jnp.float32 and isinstance(x, V.FragmentedArray)
                and not isinstance(x.layout, V.fa.WGSplatFragLayout)):
            # CompilerParams(approx_math=True): ex2.approx (exp as exp2 of x * log2(e)).
            return getattr(x, _APPROX[eqn.primitive])(approx=True)
        wide = upcast and jnp.dtype(_in_dtype(eqn)).itemsize < 4

        def f(v):
            if not wide:
                return op(v)
            t = v.type
            r = op(arith.extf(V.with_elem_type(t, ir.F32Type.get()), v))
            return arith.truncf(t, r)

        return pointwise(eqn, [x], f)

    return lower


def _logistic(v):
    one = V.const_like(1.0, v)
    return arith.divf(one, arith.addf(one, mmath.exp(arith.negf(v))))


_APPROX = {P.exp_p: "exp", P.exp2_p: "exp2"}

for _p, _op in {
    P.exp_p: mmath.exp, P.exp2_p: mmath.exp2, P.log_p: mmath.log, P.log1p_p: mmath.log1p,
    P.expm1_p: mmath.expm1, P.sin_p: mmath.sin, P.cos_p: mmath.cos, P.tan_p: mmath.tan,
    P.tanh_p: mmath.tanh, P.sinh_p: mmath.sinh, P.cosh_p: mmath.cosh,
    P.asin_p: mmath.asin, P.acos_p: mmath.acos, P.atan_p: mmath.atan,
    P.asinh_p: mmath.asinh, P.acosh_p: mmath.acosh, P.atanh_p: mmath.atanh,
    P.sqrt_p: mmath.sqrt, P.rsqrt_p: mmath.rsqrt, P.cbrt_p: mmath.cbrt,
    P.erf_p: mmath.erf, P.erfc_p: mmath.erfc, P.logistic_p: _logistic,
}.items():
    rule(_p)(_float_unary(_op))

rule(P.floor_p)(_float_unary(mmath.floor, upcast=False))
rule(P.ceil_p)(_float_unary(mmath.ceil, upcast=False))


@rule(P.round_p)
def _round(lctx, eqn, x):
    method = int(eqn.params.get("rounding_method", 0))
    return _float_unary(mmath.roundeven if method == 1 else mmath.round, upcast=False)(
        lctx, eqn, x)


@rule(P.is_finite_p)
def _is_finite(lctx, eqn, x):
    return pointwise(eqn, [x], mmath.isfinite)


@rule(P.atan2_p)
def _atan2(lctx, eqn, a, b):
    wide = jnp.dtype(_in_dtype(eqn)).itemsize < 4

    def f(x, y):
        if not wide:
            return mmath.atan2(x, y)
        t = x.type
        f32 = V.with_elem_type(t, ir.F32Type.get())
        return arith.truncf(t, mmath.atan2(arith.extf(f32, x), arith.extf(f32, y)))

    return pointwise(eqn, [a, b], f)


@rule(P.neg_p)
def _neg(lctx, eqn, x):
    if V.kind(_in_dtype(eqn)) == "f":
        return pointwise(eqn, [x], arith.negf)
    return pointwise(eqn, [x], lambda v: arith.subi(V.const_like(0, v), v))


@rule(P.abs_p)
def _abs(lctx, eqn, x):
    k = V.kind(_in_dtype(eqn))
    if k == "f":
        return pointwise(eqn, [x], mmath.absf)
    if k == "i":
        return pointwise(eqn, [x], mmath.absi)
    return x


@rule(P.sign_p)
def _sign(lctx, eqn, x):
    k = V.kind(_in_dtype(eqn))

    def f(v):
        zero, one = V.const_like(0, v), V.const_like(1, v)
        if k == "f":
            s = mmath.copysign(one, v)
            keep = arith.ori(arith.cmpf(CF.OEQ, v, zero), arith.cmpf(CF.UNO, v, v))
            return arith.select(keep, v, s)
        pos = arith.select(arith.cmpi(CI.ne, v, zero), one, zero)
        if k == "i":
            return arith.select(arith.cmpi(CI.slt, v, zero), V.const_like(-1, v), pos)
        return pos

    return pointwise(eqn, [x], f)


@rule(P.not_p)
def _not(lctx, eqn, x):
    return pointwise(eqn, [x], lambda v: arith.xori(v, V.const_like(-1, v)))


@rule(P.square_p)
def _square(lctx, eqn, x):
    op = arith.mulf if V.kind(_in_dtype(eqn)) == "f" else arith.muli
    return pointwise(eqn, [x], lambda v: op(v, v))


@rule(P.integer_pow_p)
def _integer_pow(lctx, eqn, x):
    y = int(eqn.params["y"])
    is_f = V.kind(_in_dtype(eqn)) == "f"
    return pointwise(eqn, [x], lambda v: integer_pow(
        v, y, lambda c: V.const_like(c, v), is_float=is_f))


def _shift(kind_op):
    def lower(lctx, eqn, a, b):
        bits = jnp.dtype(_in_dtype(eqn)).itemsize * 8

        def f(x, s):
            # lax: shifting by >= the bit width gives 0 (or the sign for arithmetic).
            big = arith.cmpi(CI.uge, s, V.const_like(bits, s))
            if kind_op == "left":
                return arith.select(big, V.const_like(0, x), arith.shli(x, s))
            if kind_op == "logical":
                return arith.select(big, V.const_like(0, x), arith.shrui(x, s))
            clamped = arith.select(big, V.const_like(bits - 1, s), s)
            return arith.shrsi(x, clamped)

        return pointwise(eqn, [a, b], f)

    return lower


rule(P.shift_left_p)(_shift("left"))
rule(P.shift_right_logical_p)(_shift("logical"))
rule(P.shift_right_arithmetic_p)(_shift("arithmetic"))


@rule(P.population_count_p)
def _popcount(lctx, eqn, x):
    return pointwise(eqn, [x], mmath.ctpop)


@rule(P.clz_p)
def _clz(lctx, eqn, x):
    return pointwise(eqn, [x], mmath.ctlz)


@rule(P.select_n_p)
def _select_n(lctx, eqn, which, *cases):
    if len(cases) == 1:
        return cases[0]
    pred_kind = V.kind(_in_dtype(eqn))
    n = len(cases)

    def f(w, *vals):
        if pred_kind == "b":
            return arith.select(w, vals[1], vals[0])
        out = vals[n - 1]
        for i in range(n - 2, -1, -1):
            out = arith.select(arith.cmpi(CI.eq, w, V.const_like(i, w)), vals[i], out)
        return out

    return pointwise(eqn, [which, *cases], f)


@rule(P.clamp_p)
def _clamp(lctx, eqn, lo, x, hi):
    k = V.kind(_in_dtype(eqn, 1))
    mx = {"f": arith.maximumf, "i": arith.maxsi}.get(k, arith.maxui)
    mn = {"f": arith.minimumf, "i": arith.minsi}.get(k, arith.minui)
    return pointwise(eqn, [lo, x, hi], lambda a, v, b: mn(mx(v, a), b))


@rule(P.convert_element_type_p)
def _convert(lctx, eqn, x):
    src, dst = _in_dtype(eqn), eqn.params["new_dtype"]
    if jnp.dtype(dst).itemsize > 4:
        raise NotImplementedError(f"converting to {jnp.dtype(dst).name} (64-bit)")
    float8 = "float8" in jnp.dtype(src).name or "float8" in jnp.dtype(dst).name
    if (isinstance(x, V.FragmentedArray)
            and (isinstance(x.layout, V.fa.TiledLayout) or float8)
            and "b" not in (V.kind(src), V.kind(dst)) and jnp.dtype(src) != jnp.dtype(dst)):
        # Mosaic GPU's conversion keeps the layout and packs pairs (cvt.*x2); float8 has
        # only those (LLVM cannot translate an arith.truncf/extf to float8), in any layout.
        return x.astype(V.elem_type(dst), is_signed=V.signed(dst))
    if float8:
        raise NotImplementedError(
            f"converting a scalar between {jnp.dtype(src).name} and {jnp.dtype(dst).name}: "
            f"Mosaic GPU converts float8 arrays only (pallas-mosaic-gpu)")
    return pointwise(eqn, [x], lambda v: V.convert(v, src, dst))


@rule(P.bitcast_convert_type_p)
def _bitcast(lctx, eqn, x):
    src, dst = jnp.dtype(_in_dtype(eqn)), jnp.dtype(eqn.params["new_dtype"])
    if src.itemsize != dst.itemsize:
        raise NotImplementedError("bitcasts between dtypes of different widths")
    return pointwise(
        eqn, [x], lambda v: arith.bitcast(V.with_elem_type(v.type, V.elem_type(dst)), v))


@rule(P.copy_p, P.stop_gradient_p, P.sharding_constraint_p, jc.reshard_p)
def _copy(lctx, eqn, x):
    return x


@rule(P.pow_p)
def _pow(lctx, eqn, a, b):
    """``x ** y``; an integer exponent keeps the sign of a negative base when odd."""
    if V.kind(_in_dtype(eqn)) != "f":
        raise NotImplementedError("pow with an integer base")
    int_exp = V.kind(_in_dtype(eqn, 1)) != "f"
    wide = jnp.dtype(_in_dtype(eqn)).itemsize < 4

    def f(x, y):
        t = x.type
        f32 = V.with_elem_type(t, ir.F32Type.get())
        xf = arith.extf(f32, x) if wide else x
        if not int_exp:
            yf = arith.extf(f32, y) if wide else y
            r = mmath.powf(xf, yf)
        else:
            yf = arith.sitofp(f32, y)
            mag = mmath.powf(mmath.absf(xf), yf)
            odd = arith.cmpi(CI.ne, arith.andi(y, V.const_like(1, y)), V.const_like(0, y))
            neg = arith.andi(odd, arith.cmpf(CF.OLT, xf, V.const_like(0.0, xf)))
            r = arith.select(neg, arith.negf(mag), mag)
        return arith.truncf(t, r) if wide else r

    return pointwise(eqn, [a, b], f)


@rule(P.nextafter_p)
def _nextafter(lctx, eqn, a, b):
    """The next representable float after ``x`` towards ``y`` (IEEE bit stepping)."""
    dt = jnp.dtype(_in_dtype(eqn))
    if dt != jnp.float32:
        raise NotImplementedError(f"nextafter on {dt.name}")

    def f(x, y):
        ity = V.with_elem_type(x.type, ir.IntegerType.get_signless(32))
        bits = arith.bitcast(ity, x)
        zero = V.const_like(0.0, x)
        up = arith.cmpi(CI.eq, arith.extui(V.with_elem_type(x.type, ir.IntegerType.get_signless(32)),
                                           arith.cmpf(CF.OLT, x, y)),
                        arith.extui(V.with_elem_type(x.type, ir.IntegerType.get_signless(32)),
                                    arith.cmpf(CF.OGT, x, zero)))
        step = arith.select(up, V.const_like(1, bits), V.const_like(-1, bits))
        moved = arith.bitcast(x.type, arith.addi(bits, step))
        tiny = mmath.copysign(arith.bitcast(x.type, V.const_like(1, bits)), y)
        out = arith.select(arith.cmpf(CF.OEQ, x, zero), tiny, moved)
        out = arith.select(arith.cmpf(CF.OEQ, x, y), y, out)
        nan = arith.cmpf(CF.UNO, x, y)
        return arith.select(nan, arith.addf(x, y), out)

    return pointwise(eqn, [a, b], f)


@rule(P.erf_inv_p)
def _erf_inv(lctx, eqn, x):
    """Giles' single-precision approximation (``pallas.mlir_math.erf_inv``)."""
    return _float_unary(lambda v: erf_inv(v, lambda c: V.const_like(c, v)))(lctx, eqn, x)


@rule(P.lgamma_p)
def _lgamma(lctx, eqn, x):
    """``lgamma`` through libdevice (16-bit floats in float32)."""
    dt = jnp.dtype(_in_dtype(eqn))

    def one(v):
        if dt.itemsize < 4:
            f32 = ir.F32Type.get()
            return arith.truncf(v.type, libdevice(lctx, "__nv_lgammaf", [arith.extf(f32, v)],
                                                  f32))
        return libdevice(lctx, "__nv_lgammaf", [v], v.type)

    if V.kind(dt) != "f":
        raise NotImplementedError(f"lgamma on {dt.name}")
    return pointwise(eqn, [x], lambda v: _per_element(one, v))


@rule(P.digamma_p)
def _digamma(lctx, eqn, x):
    """``digamma``: reflection below 1/2, six recurrence steps, then the asymptotic
    series; NaN at the poles (non-positive integers), as XLA."""
    import math

    def f(v):
        c = functools.partial(V.const_like, like=v)
        reflect = arith.cmpf(CF.OLT, v, c(0.5))
        xr = arith.select(reflect, arith.subf(c(1.0), v), v)
        acc = c(0.0)
        for k in range(6):
            acc = arith.addf(acc, arith.divf(c(1.0), arith.addf(xr, c(float(k)))))
        z = arith.addf(xr, c(6.0))
        iz2 = arith.divf(c(1.0), arith.mulf(z, z))
        series = c(-1.0 / 132)
        for coef in (1.0 / 240, -1.0 / 252, 1.0 / 120, -1.0 / 12):
            series = arith.addf(c(coef), arith.mulf(series, iz2))
        series = arith.mulf(series, iz2)
        r = arith.subf(arith.subf(mmath.log(z), arith.divf(c(0.5), z)), arith.negf(series))
        r = arith.subf(r, acc)
        pix = arith.mulf(c(math.pi), v)
        refl = arith.subf(r, arith.divf(c(math.pi), mmath.tan(pix)))
        r = arith.select(reflect, refl, r)
        pole = arith.andi(arith.cmpf(CF.OLE, v, c(0.0)),
                          arith.cmpf(CF.OEQ, mmath.floor(v), v))
        return arith.select(pole, c(float("nan")), r)

    return _float_unary(f)(lctx, eqn, x)
