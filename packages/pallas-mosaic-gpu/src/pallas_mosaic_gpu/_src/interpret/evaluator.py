"""The evaluator of GPU interpret mode: runs a kernel jaxpr for one simulated thread.

Values are concrete (the whole simulation runs inside a host callback), so control flow
is plain Python: ``cond`` picks its branch, ``while``/``scan`` loop. Refs are
:class:`~.memory.Buffer` objects shared between threads. Evaluation is a generator: a
rule that must wait (a barrier, a semaphore) yields a :class:`~.threads.Blocker` and
the scheduler runs other threads meanwhile.

Rules live in ``GPU_RULES`` (``rule(th, eqn, invals) -> outs``, plain function or
generator). A primitive without a GPU rule but with a reference-interpreter rule runs
that rule on the buffers' contents; pure primitives are bound as they are.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import primitives as _P

from pallas.plugins import Cell, KernelContext, RuleTable, interpret_rules
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.interpret.memory import Buffer

#: GPU interpret mode's rules, keyed by primitive object.
GPU_RULES = RuleTable("mosaic_gpu interpret mode",
                      "rule(th, eqn, invals) -> outs (a function or a generator)")


def register_gpu_rule(*prims):
    """Decorator: the GPU-interpret-mode rule of ``prims`` (a function or a generator)."""
    return GPU_RULES.register(*prims, owner="pallas_mosaic_gpu")


def no_effect(th, eqn, invals) -> list:
    """The rule of a primitive with nothing to do in GPU interpret mode (a hint, or a
    wait for work that completed when it was issued): no outputs."""
    return []


@functools.cache
def _is_generator(rule: Callable) -> bool:
    return inspect.isgeneratorfunction(rule)


def eval_jaxpr(th, jaxpr, consts, args) -> Generator:
    """Evaluates ``jaxpr`` for thread ``th``; returns (via ``yield from``) its outputs."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jc.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        th.site_eqn = eqn
        rule = GPU_RULES.get(eqn.primitive)
        if rule is not None:
            is_gen = _is_generator(rule)
            outs = (yield from rule(th, eqn, invals)) if is_gen else rule(th, eqn, invals)
        elif any(isinstance(x, Buffer) for x in invals):
            outs = _core_rule(th, eqn, invals)
        else:
            outs = pure(th, eqn, invals)
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def eval_closed(th, closed, args) -> Generator:
    return (yield from eval_jaxpr(th, closed.jaxpr, closed.consts, args))


def _is_float(aval) -> bool:
    return hasattr(aval, "dtype") and jnp.issubdtype(aval.dtype, jnp.floating)


def pure(th, eqn, invals) -> list:
    """Binds a primitive without ref operands (skipping floating-point work on request)."""
    if th.launch.params.skip_floating_point_ops:
        outs = [v.aval for v in eqn.outvars]
        if outs and all(_is_float(a) for a in outs):
            return [jnp.full(a.shape, jnp.inf, a.dtype) for a in outs]
        invals = [jnp.full(jnp.shape(x), jnp.inf, x.dtype)
                  if _is_float(getattr(x, "aval", jax.typeof(x))) else x for x in invals]
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = params.pop("subfuns", ())
    outs = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


def _core_rule(th, eqn, invals) -> list:
    """Runs a primitive's reference-interpreter rule on the buffers it touches, logging
    whole-buffer accesses for the race detector as its effects say."""
    rule = interpret_rules.get(eqn.primitive)
    if rule is None:
        raise NotImplementedError(
            f"GPU interpret mode (pallas-mosaic-gpu) has no rule for the primitive "
            f"'{eqn.primitive.name}' applied to refs")
    cells = {}
    args = []
    for x in invals:
        if isinstance(x, Buffer):
            if id(x) not in cells:
                cells[id(x)] = (x, Cell(x.value, x.name, None, x.space))
            args.append(cells[id(x)][1])
        else:
            args.append(x)
    ctx = KernelContext(th.grid_indices, th.grid, axis_names=th.axis_names)
    outs = rule(ctx, eqn, args)
    written = {getattr(e, "input_index", None) for e in eqn.effects
               if type(e).__name__ in ("WriteEffect", "AccumEffect")}
    for i, x in enumerate(invals):
        if isinstance(x, Buffer):
            th.access(x, "write" if i in written else "read")
    for buf, cell in cells.values():
        buf.value = cell.value
    return list(outs)


# -- control flow -------------------------------------------------------------------------


def _has_effects(eqn) -> bool:
    return bool(eqn.effects)


@register_gpu_rule(_P.cond_p)
def _cond(th, eqn, invals):
    if not _has_effects(eqn) and not any(isinstance(x, Buffer) for x in invals):
        return pure(th, eqn, invals)
    index, *ops = invals
    branch = eqn.params["branches"][int(np.clip(int(index), 0,
                                                len(eqn.params["branches"]) - 1))]
    return (yield from eval_closed(th, branch, ops))


@register_gpu_rule(_P.while_p)
def _while(th, eqn, invals):
    if not _has_effects(eqn) and not any(isinstance(x, Buffer) for x in invals):
        return pure(th, eqn, invals)
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:nc], invals[nc:nc + nb], list(invals[nc + nb:])
    while True:
        (pred,) = yield from eval_closed(th, p["cond_jaxpr"], [*cconsts, *carry])
        if not bool(pred):
            return carry
        carry = yield from eval_closed(th, p["body_jaxpr"], [*bconsts, *carry])


@register_gpu_rule(_P.scan_p)
def _scan(th, eqn, invals):
    if not _has_effects(eqn) and not any(isinstance(x, Buffer) for x in invals):
        return pure(th, eqn, invals)
    p = eqn.params
    nconsts, ncarry, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry = invals[:nconsts], list(invals[nconsts:nconsts + ncarry])
    xs = invals[nconsts + ncarry:]
    ys_per_step = []
    steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in steps:
        outs = yield from eval_closed(th, p["jaxpr"], [*consts, *carry, *[x[i] for x in xs]])
        carry, ys = list(outs[:ncarry]), outs[ncarry:]
        ys_per_step.append(ys)
    if p["reverse"]:
        ys_per_step.reverse()
    ys_avals = [v.aval for v in eqn.outvars[ncarry:]]
    stacked = [jnp.stack([ys[j] for ys in ys_per_step]) if length else
               jnp.zeros(a.shape, a.dtype) for j, a in enumerate(ys_avals)]
    return [*carry, *stacked]


def _inline(param: str, closed: bool = True):
    def rule(th, eqn, invals):
        # On several devices the inner equations run one by one (see devices.py: a
        # compiled call of them may wait forever behind the blocked devices).
        if (not _has_effects(eqn) and not any(isinstance(x, Buffer) for x in invals)
                and th.launch.group is None):
            return pure(th, eqn, invals)
        sub = eqn.params[param]
        if closed:
            return (yield from eval_closed(th, sub, invals))
        return (yield from eval_jaxpr(th, sub, (), invals))

    return rule


register_gpu_rule(_P.jit_p)(_inline("jaxpr"))
register_gpu_rule(_P.closed_call_p)(_inline("call_jaxpr"))
register_gpu_rule(_P.custom_jvp_call_p)(_inline("call_jaxpr"))
register_gpu_rule(_P.custom_vjp_call_p)(_inline("call_jaxpr"))
