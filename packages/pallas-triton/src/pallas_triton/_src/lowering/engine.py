"""Walks a kernel jaxpr and emits ``triton.language`` source through per-primitive rules.

:data:`RULES` is pallas-triton's one lowering table, keyed by primitive object; every
rule is ``rule(ctx, eqn, *invals) -> list[Value]`` (values are :class:`Value`, refs
:class:`GlobalRef`/:class:`LocalRef`). A rule that cannot express something raises
:class:`TritonLoweringError` (``codegen.unsupported``); the walker adds the primitive,
the kernel and the source line, as pallas-tpu's engine does. Primitives the backend
does not lower are declared with ``RULES.unsupported(prim, reason=...)`` and the reason
is quoted in the error.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from pallas import plugins
from pallas_triton._src import jax_compat as jc
from pallas_triton._src.codegen import (
    Emitter,
    GlobalRef,
    LocalRef,
    TritonLoweringError,
    Value,
    check_pow2,
    py_scalar,
    tl_dtype,
    unsupported,
)

#: pallas-triton's lowering rules: ``rule(ctx, eqn, *invals) -> list[Value]``.
RULES = plugins.RuleTable("triton lowering", "rule(ctx: LoweringContext, eqn, *invals) -> "
                                             "list[Value]")


def rule(*prims):
    """Registers the decorated function as the Triton lowering rule of ``prims``; its
    operands may be refs (``GlobalRef``/``LocalRef``)."""
    return RULES.register(*prims, owner="pallas_triton")


def value_rule(*prims):
    """Like :func:`rule`, for rules over values only: a ref operand is an error naming
    the primitive."""

    def register(fn):
        def on_values(ctx, eqn, *invals):
            for v in invals:
                if isinstance(v, (GlobalRef, LocalRef)):
                    raise unsupported(f"passing a ref to {eqn.primitive.name!r}")
            return fn(ctx, eqn, *invals)

        on_values.__name__ = on_values.__qualname__ = fn.__name__
        on_values.__doc__ = fn.__doc__
        rule(*prims)(on_values)
        return fn

    return register


class LoweringContext:
    """Per-kernel state: the emitter, the grid, the program ids, the kernel's name and
    the jaxpr variables that are read later (e.g. the old value of a swap)."""

    def __init__(self, em: Emitter, grid: tuple[int, ...], name: str = "kernel",
                 target: str | None = None):
        self.em = em
        self.grid = grid
        self.name = name
        self.target = target  # None: NVIDIA; else an AMD architecture ("gfx942")
        self.pids: list[Value] = []
        self.used_vars: set = set()

    def is_used(self, var) -> bool:
        return var in self.used_vars


def _read(env, atom):
    if isinstance(atom, jc.Literal):
        aval = atom.aval
        val = np.asarray(atom.val)
        if val.shape != ():
            raise unsupported(f"an array literal of shape {val.shape}")
        return Value(py_scalar(val, aval.dtype), (), aval.dtype, literal=True)
    return env[atom]


def lower_jaxpr(ctx: LoweringContext, jaxpr, consts, args) -> list:
    """Emits ``jaxpr`` (an open Jaxpr) with its constvars and invars bound; returns outs."""
    env: dict = {}
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    if len(args) != len(jaxpr.invars):
        raise TritonLoweringError(
            f"internal: jaxpr takes {len(jaxpr.invars)} arguments, got {len(args)}")
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        ctx.used_vars.update(v for v in eqn.invars if not isinstance(v, jc.Literal))
    ctx.used_vars.update(v for v in jaxpr.outvars if not isinstance(v, jc.Literal))
    for eqn in jaxpr.eqns:
        invals = [_read(env, a) for a in eqn.invars]
        if eqn.primitive not in PASSES_STACKED:
            try:
                check_not_padded(invals, f"passed to {eqn.primitive.name!r}")
            except TritonLoweringError as e:
                raise _located(e, ctx, eqn) from None
        outs = _lower_eqn(ctx, eqn, invals)
        if len(outs) != len(eqn.outvars):
            raise TritonLoweringError(
                f"internal: rule for {eqn.primitive.name} returned {len(outs)} values")
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [_read(env, v) for v in jaxpr.outvars]


#: Primitives whose operands may be a scan's padded stacked results (``Value.rows``):
#: ``scan`` reads them as rows; calls and ``cond`` hand them to a body, whose uses are
#: checked in turn (rules_control adds those).
PASSES_STACKED: set = {lax.scan_p}


def check_not_padded(vals, use: str) -> None:
    """Stacked rows a scan padded to a power of two (``Value.rows``) are read by scans
    only: any other use would see the padding."""
    for v in vals:
        n = getattr(v, "rows", None)
        if n is not None:
            raise unsupported(
                f"the stacked results of a lax.scan of length {n} (not a power of two) "
                f"{use}", "only another lax.scan may read them; use a power-of-two length")


def _lower_eqn(ctx: LoweringContext, eqn, invals) -> list:
    try:
        rule_ = RULES.require(eqn.primitive, lambda reason: unsupported(
            f"the primitive {eqn.primitive.name!r}", reason))
        return rule_(ctx, eqn, *invals)
    except TritonLoweringError as e:
        raise _located(e, ctx, eqn) from None


def _located(e: TritonLoweringError, ctx: LoweringContext, eqn) -> TritonLoweringError:
    """``e`` naming the innermost primitive, the kernel and the first user source line
    found going outwards (a primitive inside library code, e.g. ``jnp.sort``'s own
    ``jit``, is located at the user's call)."""
    if getattr(e, "located", False):
        return e
    if getattr(e, "primitive", None) is None:
        e.primitive = eqn.primitive.name
    where = jc.source_info_summary(eqn)
    if not where:
        return e
    located = TritonLoweringError(
        f"{e} (lowering {e.primitive!r} in kernel {ctx.name}, at {where})")
    located.located, located.primitive = True, e.primitive
    located.__traceback__ = e.__traceback__
    return located


def jaxpr_and_consts(j):
    """(open jaxpr, const Values) for a ClosedJaxpr or Jaxpr parameter."""
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, [const_value(c) for c in j.consts]
    return j, []


def const_value(c) -> Value:
    arr = np.asarray(c)
    if arr.shape != ():
        raise unsupported(
            f"a captured array constant of shape {arr.shape}",
            "pass the array to pallas_call as an input, or build it with jnp.arange/jnp.full",
        )
    return Value(py_scalar(arr, arr.dtype), (), arr.dtype, literal=True)


def alloc_local(em: Emitter, t, origin: str, prefix: str) -> LocalRef:
    """A zero-initialised register buffer for scratch or ``run_scoped``."""
    space = getattr(t, "memory_space", None)
    if "semaphore" in str(space).lower() or "Semaphore" in type(space).__name__:
        raise unsupported(f"the semaphore buffer {origin}",
                          "semaphores need the Mosaic backends (pallas-tpu, pallas-mosaic-gpu)")
    shape = tuple(int(n) for n in t.shape)
    check_pow2(shape, origin)
    name = em.fresh(prefix)
    em.line(f"{name} = tl.zeros({list(shape)}, {tl_dtype(t.dtype)})")
    return LocalRef(name, shape, t.dtype, origin)
