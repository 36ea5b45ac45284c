"""Per-primitive cost rules behind ``pl.estimate_cost``: flops and transcendentals of a jaxpr.

The rules follow upstream's model, so estimates agree figure for figure: an elementwise
arithmetic op costs one flop per output element, a transcendental function one
transcendental per input element, ``integer_pow`` a square-and-multiply chain,
``dot_general`` two flops per multiply-add; higher-order primitives cost their bodies.
Anything else (data movement, reductions, comparisons) costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from jax.extend.core import primitives as P

from pallas._src import jax_compat as jc

Cost = tuple[int, int, int]  # flops, transcendentals, bytes accessed
_RULES: dict[Any, Callable[..., Cost]] = {}


def _size(aval: Any) -> int:
    return math.prod(aval.shape)


def jaxpr_cost(jaxpr: Any) -> Cost:
    """Sums the cost rules over ``jaxpr``'s equations (a ``Jaxpr`` or ``ClosedJaxpr``)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    flops = transcendentals = bytes_accessed = 0
    for eqn in jaxpr.eqns:
        rule = _RULES.get(eqn.primitive)
        if rule is None:
            continue
        f, t, b = rule([v.aval for v in eqn.invars], [v.aval for v in eqn.outvars], **eqn.params)
        flops, transcendentals, bytes_accessed = flops + f, transcendentals + t, bytes_accessed + b
    return flops, transcendentals, bytes_accessed


def _elementwise(avals_in, avals_out, **_) -> Cost:
    return _size(avals_out[0]), 0, 0


def _unary(avals_in, avals_out, **_) -> Cost:
    return _size(avals_in[0]), 0, 0


def _transcendental(avals_in, avals_out, **_) -> Cost:
    return 0, _size(avals_in[0]), 0


def _integer_pow(avals_in, avals_out, *, y: int, **_) -> Cost:
    """``x ** y`` by repeated squaring: one squaring per bit below the top, one multiply
    per set bit (``x ** 0`` and ``x ** 1`` cost nothing)."""
    per_element = 0 if y in (0, 1) else (abs(y).bit_length() - 1) + abs(y).bit_count()
    return _size(avals_in[0]) * per_element, 0, 0


def _dot_general(avals_in, avals_out, *, dimension_numbers, **_) -> Cost:
    """Two flops (multiply, add) per contracted element of each output element."""
    (lhs_contract, rhs_contract), (_, rhs_batch) = dimension_numbers
    lhs, rhs = avals_in[0].shape, avals_in[1].shape
    contracted = math.prod(lhs[d] for d in lhs_contract)
    lhs_free = math.prod(n for d, n in enumerate(lhs) if d not in lhs_contract)
    rhs_free = math.prod(n for d, n in enumerate(rhs)
                         if d not in rhs_contract and d not in rhs_batch)
    return 2 * contracted * lhs_free * rhs_free, 0, 0


def _body(param: str) -> Callable[..., Cost]:
    def rule(avals_in, avals_out, **params) -> Cost:
        return jaxpr_cost(params[param])
    return rule


for _p in (P.add_p, P.mul_p, P.sub_p, P.div_p, P.min_p, P.max_p, P.or_p, P.and_p, P.xor_p):
    _RULES[_p] = _elementwise
for _p in (P.neg_p, P.floor_p, P.ceil_p, P.round_p, P.not_p):
    _RULES[_p] = _unary
for _p in (P.cos_p, P.sin_p, P.tan_p, P.sinh_p, P.cosh_p, P.tanh_p, P.acos_p, P.asin_p,
           P.atan_p, P.exp_p, P.log_p, P.logistic_p, P.sqrt_p):
    _RULES[_p] = _transcendental
_RULES[P.integer_pow_p] = _integer_pow
_RULES[P.dot_general_p] = _dot_general
_RULES[P.jit_p] = _body("jaxpr")
_RULES[P.custom_vjp_call_p] = _body("call_jaxpr")
_RULES[jc.run_state_p] = _body("jaxpr")
