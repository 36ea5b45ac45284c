"""Helpers of the value rules: the output's shape and dtype, emitting an assignment,
operands as expressions, and bf16 computed in f32 (rounded once)."""

from __future__ import annotations

from pallas_triton._src.codegen import Value, dtype_name, literal_operand, tl_dtype


def _out(eqn):
    aval = eqn.outvars[0].aval
    return tuple(aval.shape), aval.dtype


def _emit(ctx, eqn, expr: str) -> list[Value]:
    shape, dtype = _out(eqn)
    return [ctx.em.assign(expr, shape, dtype)]


def _op(v: Value) -> str:
    return literal_operand(v)


def _is_bf16(dtype) -> bool:
    return dtype_name(dtype) == "bfloat16"


def _wide(v: Value) -> str:
    """``v`` as an operand of arithmetic: bf16 computes in f32 (then rounds once).

    For one operation this is exactly the correctly rounded bf16 result, as on the GPU
    and in XLA; it also keeps Triton's interpreter (which stores bf16 as raw 16-bit
    integers) from doing integer arithmetic on the bits.
    """
    if _is_bf16(v.dtype) and not v.literal:
        return f"{v.expr}.to(tl.float32)"
    return _op(v)


def _narrow(expr: str, dtype) -> str:
    return f"({expr}).to(tl.bfloat16)" if _is_bf16(dtype) else expr


def _cast(v: Value, to: str, bitcast: bool = False) -> str:
    if v.literal:
        v_expr = f"tl.full([], {v.expr}, {tl_dtype(v.dtype)})"
    else:
        v_expr = v.expr
    return f"{v_expr}.to({to}{', bitcast=True' if bitcast else ''})"


def _f32_wrap(dtype, template: str, *args: Value) -> str:
    """Applies ``template`` in f32 for f16/bf16 inputs (Triton's math needs f32/f64)."""
    low = dtype_name(dtype) in ("float16", "bfloat16")
    ops = [_cast(a, "tl.float32") if low else _op(a) for a in args]
    expr = template.format(*ops)
    if low:
        expr = f"({expr}).to({tl_dtype(dtype)})"
    return expr


def splat(ctx, x: Value, shape, dtype) -> str:
    return f"tl.full({list(shape)}, {_op(x)}, {tl_dtype(dtype)})"
