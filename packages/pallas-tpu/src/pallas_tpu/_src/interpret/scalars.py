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


def _tdiv(a, b):
    if b == 0:
        raise Fallback()
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _trem(a, b):
    if b == 0:
        raise Fallback()
    return a - b * _tdiv(a, b)


_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
    "div": "_tdiv({0}, {1})", "rem": "_trem({0}, {1})", "max": "max({0}, {1})",
    "min": "min({0}, {1})", "eq": "({0} == {1})", "ne": "({0} != {1})",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})",
}
_UNARY = {"neg": "(-{0})", "abs": "abs({0})", "sign": "(({0} > 0) - ({0} < 0))"}
_IDENTITY = {"squeeze", "reshape", "broadcast_in_dim", "copy", "copy_p"}


def _scalar_int(v) -> bool:
    aval = getattr(v, "aval", None)
    if aval is None or getattr(aval, "shape", None) != ():
        return False
    dt = np.dtype(aval.dtype)
    return dt == np.bool_ or np.issubdtype(dt, np.integer)


def _wrapped(expr: str, dtype) -> str:
    """``expr`` (a Python int or bool expression) as a value of ``dtype``: bools as they
    are, integers wrapped to the dtype's width (two's complement)."""
    if dtype == np.bool_:
        return f"bool({expr})"
    info = np.iinfo(dtype)
    mask = (1 << info.bits) - 1
    if info.min == 0:
        return f"({expr} & {mask})"
    half = 1 << (info.bits - 1)
    return f"((({expr} + {half}) & {mask}) - {half})"


def _expr(eqn, ops):
    """A Python expression computing ``eqn``'s single result from operand expressions
    ``ops``, or None when the primitive is not one of the exactly reproduced ones."""
    name = eqn.primitive.name
    dtype = np.dtype(eqn.outvars[0].aval.dtype)
    if name in _BINARY and len(ops) == 2:
        if name in ("eq", "ne", "lt", "le", "gt", "ge"):
            return _BINARY[name].format(*ops)  # a Python bool already
        return _wrapped(_BINARY[name].format(*ops), dtype)
    if name in _UNARY and len(ops) == 1:
        return _wrapped(_UNARY[name].format(*ops), dtype)
    if name == "not":
        return f"(not {ops[0]})" if dtype == np.bool_ else _wrapped(f"(~{ops[0]})", dtype)
    if name == "convert_element_type":
        return f"({ops[0]} != 0)" if dtype == np.bool_ else _wrapped(f"int({ops[0]})", dtype)
    if name == "select_n":
        return f"({', '.join(ops[1:])},)[{ops[0]}]"
    if name in _IDENTITY:
        return ops[0]
    return None


class _Source:
    """Python source being generated: lines, fresh names, and constants."""

    def __init__(self):
        self.lines: list[str] = []
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"


def _emit(src: _Source, eqns, env: dict) -> bool:
    """Appends the lines computing ``eqns`` (operand names in ``env``, a var -> Python
    expression map it extends); False when something is not scalar integer arithmetic."""
    for eqn in eqns:
        if eqn.effects:
            return False
        if not all(_scalar_int(v) for v in [*eqn.invars, *eqn.outvars]):
            return False
        ops = [_literal(v) if isinstance(v, jc.Literal) else env[v]
               for v in eqn.invars]
        sub = _call_body(eqn)
        if sub is not None:  # a nested jit (jnp functions): inlined
            if sub.constvars:
                return False
            inner = dict(zip(sub.invars, ops))
            if not _emit(src, sub.eqns, inner):
                return False
            for v, w in zip(eqn.outvars, sub.outvars):
                env[v] = _literal(w) if isinstance(w, jc.Literal) else inner[w]
            continue
        if len(eqn.outvars) != 1:
            return False
        expr = _expr(eqn, ops)
        if expr is None:
            return False
        name = src.fresh()
        src.lines.append(f"    {name} = {expr}")
        env[eqn.outvars[0]] = name
    return True


def _literal(v) -> str:
    """A literal operand as Python source (a plain int or bool)."""
    x = _py(v.val)
    return repr(bool(x)) if np.dtype(v.aval.dtype) == np.bool_ else repr(int(x))


def _call_body(eqn):
    if eqn.primitive.name not in ("pjit", "jit", "closed_call"):
        return None
    body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    return getattr(body, "jaxpr", body)


def plan(eqns, invars, outvars):
    """A Python function ``(*values) -> [outputs as numpy scalars]`` evaluating ``eqns``,
    or None when some value is not a scalar integer/boolean or a primitive is not one of
    the exactly reproduced ones. The function is generated Python source (straight-line
    code over Python ints), so a run of scalar equations costs one Python call."""
    if not all(_scalar_int(v) for v in invars):
        return None
    src = _Source()
    env, params = {}, []
    for k, v in enumerate(invars):
        params.append(f"a{k}")
        conv = "bool" if np.dtype(v.aval.dtype) == np.bool_ else "int"
        env[v] = src.fresh()
        src.lines.append(f"    {env[v]} = {conv}(a{k})")
    if not _emit(src, eqns, env):
        return None
    consts = {"_tdiv": _tdiv, "_trem": _trem}
    results = []
    for k, v in enumerate(outvars):
        if not _scalar_int(v):
            return None
        consts[f"t{k}"] = np.dtype(v.aval.dtype).type
        expr = _literal(v) if isinstance(v, jc.Literal) else env[v]
        results.append(f"t{k}({expr})")
    body = "\n".join(src.lines)
    code = f"def call({', '.join(params)}):\n{body}\n    return [{', '.join(results)}]\n"
    exec(compile(code, "<pallas_tpu scalar segment>", "exec"), consts)  # noqa: S102
    return consts["call"]


def _py(x):
    """A scalar operand as a Python int or bool."""
    if isinstance(x, (bool, int)):
        return x
    a = np.asarray(x)
    return a.item()
