"""``debug_print``, ``debug_check`` and ``delay``.

``debug_print`` prints from the interpreter in grid order (``{}`` placeholders, as
``jax.debug.print``). ``debug_check`` fails the call with its message when
``pl.enable_debug_checks`` is on, and does nothing otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import string

import jax
import jax.numpy as jnp

from pallas._src import config
from pallas._src import jax_compat as jc
from pallas._src.context_vars import set_for_block
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.primitives.effectful import effect_primitive


class KernelDebugEffect(jc.effects.Effect):
    """The effect of printing from a kernel: keeps prints from being removed."""

    def __repr__(self) -> str:
        return "KernelDebug"


kernel_debug_effect = KernelDebugEffect()
jc.effects.control_flow_allowed_effects.add_type(KernelDebugEffect)
jc.effects.lowerable_effects.add_type(KernelDebugEffect)
jc.effects.remat_allowed_effects.add_type(KernelDebugEffect)
jc.effects.custom_derivatives_allowed_effects.add_type(KernelDebugEffect)

debug_print_p = effect_primitive("debug_print", {kernel_debug_effect})
debug_check_p = effect_primitive("debug_check", {kernel_debug_effect})
delay_p = effect_primitive("delay", {kernel_debug_effect})


def debug_print(fmt: str, *args) -> None:
    """Prints ``fmt`` formatted with ``args`` from inside a kernel."""
    if not isinstance(fmt, str):
        raise TypeError(f"debug_print's format must be a str; got {fmt!r}")
    debug_print_p.bind(*[jnp.asarray(a) for a in args], fmt=fmt)


@register_interpret_rule(debug_print_p)
def _debug_print_rule(ctx, eqn, invals):
    jax.debug.print(_with_placeholders(eqn.params["fmt"], len(invals)), *invals,
                    ordered=False)
    return []


def _with_placeholders(fmt: str, n: int) -> str:
    """``fmt`` with a ``{}`` per value appended when it has no placeholder at all: the
    values are printed after the format string (upstream's documented TPU behaviour,
    ``pl.debug_print("x", vec)``), rather than refused by ``jax.debug.print``."""
    if n and not any(field is not None for _, field, _, _ in string.Formatter().parse(fmt)):
        return fmt + "".join(" {}" for _ in range(n))
    return fmt


# Set while tracing a kernel whose interpret=pl.InterpretParams(debug_checks=True).
_checks_requested: contextvars.ContextVar = contextvars.ContextVar(
    "pallas_debug_checks_requested", default=False)


def debug_checks_requested(on: bool) -> contextlib.AbstractContextManager[None]:
    return set_for_block(_checks_requested, bool(on))


def debug_check(condition, message: str) -> None:
    """Fails the kernel with ``message`` if ``condition`` is false (when checks are on)."""
    if not (config.debug_checks_enabled() or _checks_requested.get()):
        return
    debug_check_p.bind(jnp.asarray(condition, jnp.bool_), message=str(message))


@register_interpret_rule(debug_check_p)
def _debug_check_rule(ctx, eqn, invals):
    ctx.report(invals[0], f"debug_check failed: {eqn.params['message']}")
    return []


def delay(nanos) -> None:
    """Spins for about ``nanos`` nanoseconds (a no-op in the interpreter)."""
    delay_p.bind(jnp.asarray(nanos, jnp.int32))


@register_interpret_rule(delay_p)
def _delay_rule(ctx, eqn, invals):
    return []


def _primal_only_jvp(prim):
    """The JVP of an effect without results (prints, checks): it sees the primals only."""

    def jvp(primals, tangents, **params):
        return prim.bind(*primals, **params), []

    return jvp


for _p in (debug_print_p, debug_check_p, delay_p):
    jc.primitive_jvps[_p] = _primal_only_jvp(_p)
