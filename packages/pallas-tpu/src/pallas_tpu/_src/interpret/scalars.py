"""Scalar integer and boolean arithmetic of a kernel body, evaluated in plain Python.

Between synchronisation points a TPU kernel computes slots, offsets and predicates
(``i % 2``, ``(i + 1) * b``, ``i + 1 < n``) from grid indices and loop counters. As JAX
computations each such run costs a dispatch; here a run of equations whose every value
is a scalar integer or boolean is evaluated with Python integers, wrapped to the width
of each result's dtype, which is exactly what XLA computes (two's complement wrap-around,
C division and remainder). Anything else (floats, arrays, other primitives, division by
zero) is left to the compiled path: :func:`plan` returns None, or :class:`Fallback` is
raised while evaluating.
"""

from __future__ import annotations

import numpy as np

from pallas_tpu._src import jax_compat as jc


class Fallback(Exception):
    """This evaluation needs the compiled path (e.g. an integer division by zero)."""


def _wrap(dtype):
    """How a Python int becomes a value of ``dtype`` (bool, signed or unsigned int)."""
    if dtype == np.bool_:
        return bool
    info = np.iinfo(dtype)
    bits = info.bits
    mask = (1 << bits) - 1
    if info.min == 0:
        return lambda x: int(x) & mask
    half = 1 << (bits - 1)
    return lambda x: ((int(x) + half) & mask) - half


def _tdiv(a, b):
    if b == 0:
        raise Fallback()
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _trem(a, b):
    if b == 0:
        raise Fallback()
    return a - b * _tdiv(a, b)


def _not(a, is_bool):
    return (not a) if is_bool else ~a


def _sign(a):
    return (a > 0) - (a < 0)


_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": _tdiv, "rem": _trem, "max": max, "min": min,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
}
_UNARY = {"neg": lambda a: -a, "abs": abs, "sign": _sign}
_IDENTITY = {"squeeze", "reshape", "broadcast_in_dim", "copy", "copy_p"}


def _scalar_int(v) -> bool:
    aval = getattr(v, "aval", None)
    if aval is None or getattr(aval, "shape", None) != ():
        return False
    dt = np.dtype(aval.dtype)
    return dt == np.bool_ or np.issubdtype(dt, np.integer)


def _op(eqn):
    """A function of the operands' Python values for ``eqn``, or None."""
    name = eqn.primitive.name
    wrap = _wrap(np.dtype(eqn.outvars[0].aval.dtype))
    if name in _BINARY and len(eqn.invars) == 2:
        f = _BINARY[name]
        return lambda a, b: wrap(f(a, b))
    if name in _UNARY:
        f = _UNARY[name]
        return lambda a: wrap(f(a))
    if name == "not":
        is_bool = np.dtype(eqn.outvars[0].aval.dtype) == np.bool_
        return lambda a: wrap(_not(a, is_bool))
    if name == "convert_element_type":
        return lambda a: wrap(a != 0) if wrap is bool else wrap(a)
    if name == "select_n":
        return lambda which, *cases: cases[int(which)]
    if name in _IDENTITY:
        return lambda a: a
    return None


def _compile(eqns, invars, outvars):
    """A function of Python values computing ``outvars`` (Python values), or None."""
    steps = []
    for eqn in eqns:
        if eqn.effects:
            return None
        if not all(_scalar_int(v) for v in [*eqn.invars, *eqn.outvars]):
            return None
        sub = _call_body(eqn)
        if sub is not None:  # a nested jit (jnp functions): inlined
            op = _compile(sub.eqns, sub.invars, sub.outvars)
            if op is None or sub.constvars:
                return None
            multi = True
        elif len(eqn.outvars) == 1:
            op, multi = _op(eqn), False
            if op is None:
                return None
        else:
            return None
        args = tuple((True, _py(v.val)) if isinstance(v, jc.Literal) else (False, v)
                     for v in eqn.invars)
        steps.append((op, args, tuple(eqn.outvars), multi))
    results = tuple((True, _py(v.val)) if isinstance(v, jc.Literal) else (False, v)
                    for v in outvars)

    def run(*values):
        env = dict(zip(invars, values))
        for op, args, outs, multi in steps:
            vals = op(*[a if lit else env[a] for lit, a in args])
            if multi:
                env.update(zip(outs, vals))
            else:
                env[outs[0]] = vals
        return [a if lit else env[a] for lit, a in results]

    return run


def _call_body(eqn):
    if eqn.primitive.name not in ("pjit", "jit", "closed_call"):
        return None
    body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    return getattr(body, "jaxpr", body)


def plan(eqns, invars, outvars):
    """A Python function ``(*values) -> [outputs as numpy scalars]`` evaluating ``eqns``,
    or None when some value is not a scalar integer/boolean or a primitive is not one of
    the exactly reproduced ones."""
    run = _compile(eqns, invars, outvars)
    if run is None:
        return None
    out_types = [np.dtype(v.aval.dtype) for v in outvars]

    def call(*values):
        outs = run(*[_py(x) for x in values])
        return [np.asarray(x, t) for x, t in zip(outs, out_types)]

    return call


def _py(x):
    """A scalar operand as a Python int or bool."""
    if isinstance(x, (bool, int)):
        return x
    a = np.asarray(x)
    return a.item()
