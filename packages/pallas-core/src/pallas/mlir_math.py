"""Math functions that MLIR's ``math`` dialect lacks, emitted as ``arith``/``math`` ops.

For backends that lower to MLIR (Mosaic TPU and Mosaic GPU use it): one emission of each
approximation, whatever value model the backend has; the backend passes a ``const``
function that makes a constant of the operand's type (scalar or vector).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, math

__all__ = ["ERF_INV_CENTRAL", "ERF_INV_TAIL", "convert", "erf_inv", "horner",
           "integer_pow"]

# Giles (2010), "Approximating the erfinv function": single-precision polynomials in
# w = -log(1 - x^2), one for w < 5 (evaluated at w - 2.5), one for the tail (at
# sqrt(w) - 3). Highest degree first.
ERF_INV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                   0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
ERF_INV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def horner(coeffs: Sequence[float], t: ir.Value,
           const: Callable[[float], ir.Value], *, contract: bool = False) -> ir.Value:
    """The polynomial with ``coeffs`` (highest degree first) at the float value ``t``;
    ``contract``: each multiply-add may be fused (``fastmath<contract>``)."""
    kw = {"fastmath": ir.Attribute.parse("#arith.fastmath<contract>")} if contract else {}
    p = const(coeffs[0])
    for c in coeffs[1:]:
        p = arith.addf(const(c), arith.mulf(p, t, **kw), **kw)
    return p


def erf_inv(x: ir.Value, const: Callable[[float], ir.Value], *,
            as_xla: bool = False) -> ir.Value:
    """The inverse error function of the float32 value ``x`` (Giles' single-precision
    approximation); ``const(c)`` makes the constant ``c`` of ``x``'s type.

    ``as_xla``: evaluated as XLA's expansion is, ``w = -log1p(-x^2)``, +-inf at +-1, and
    the polynomials' multiply-adds contractible (``fastmath<contract>``): an executor that
    fuses contractible pairs as XLA:CPU does agrees with XLA's ``erf_inv`` bit for bit.
    """
    if as_xla:
        w = arith.negf(math.log1p(arith.negf(arith.mulf(x, x))))
    else:
        one = const(1.0)
        w = arith.negf(math.log(arith.mulf(arith.subf(one, x), arith.addf(one, x))))
    central = horner(ERF_INV_CENTRAL, arith.subf(w, const(2.5)), const, contract=as_xla)
    tail = horner(ERF_INV_TAIL, arith.subf(math.sqrt(w), const(3.0)), const,
                  contract=as_xla)
    p = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, w, const(5.0)), central, tail)
    if not as_xla:
        return arith.mulf(p, x)
    at_one = arith.cmpf(arith.CmpFPredicate.OEQ, math.absf(x), const(1.0))
    return arith.select(at_one, arith.mulf(x, const(float("inf"))), arith.mulf(p, x))


def integer_pow(x: ir.Value, y: int, const: Callable[[float], ir.Value], *,
                is_float: bool) -> ir.Value:
    """``x ** y`` for a static integer ``y``, by repeated squaring (``arith.mulf``, or
    ``arith.muli`` for integers); a negative ``y`` takes the reciprocal (floats only)."""
    if y < 0 and not is_float:
        raise NotImplementedError("integer_pow with a negative exponent on ints")
    mul = arith.mulf if is_float else arith.muli
    acc, base, n = None, x, abs(y)
    while n:
        if n & 1:
            acc = base if acc is None else mul(acc, base)
        n >>= 1
        if n:
            base = mul(base, base)
    if acc is None:
        return const(1)
    if y < 0:
        acc = arith.divf(const(1.0), acc)
    return acc


def convert(v: ir.Value, out_type: ir.Type, src: tuple[str, int], dst: tuple[str, int], *,
            nonzero: Callable[[ir.Value], ir.Value], f32_type: ir.Type) -> ir.Value:
    """The ``arith`` conversion of ``v`` to ``out_type``. ``src``/``dst``: (kind, bits) of
    the element types as the kernel holds them, kind ``"f"`` (float), ``"i"`` (signed),
    ``"u"`` (unsigned) or ``"b"`` (bool); ``nonzero(v)``: the backend's ``v != 0`` (any
    value to bool); ``f32_type``: f32 of ``v``'s shape, which two float formats of one
    width (f16/bf16, the float8s) convert through."""
    (ks, bs), (kd, bd) = src, dst
    if kd == "b":
        return nonzero(v)
    if ks == "f" and kd == "f":
        if bs == bd:
            return arith.truncf(out_type, arith.extf(f32_type, v))
        return arith.extf(out_type, v) if bd > bs else arith.truncf(out_type, v)
    if kd == "f":  # from an integer or a bool (unsigned)
        return arith.sitofp(out_type, v) if ks == "i" else arith.uitofp(out_type, v)
    if ks == "f":
        return arith.fptosi(out_type, v) if kd == "i" else arith.fptoui(out_type, v)
    if bd > bs:  # integer <-> integer (bool is an unsigned 1-bit integer)
        return arith.extsi(out_type, v) if ks == "i" else arith.extui(out_type, v)
    return v if bd == bs else arith.trunci(out_type, v)
