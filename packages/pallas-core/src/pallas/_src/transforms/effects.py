"""Effects and typing of ``pallas_call_p`` under ``jit``, ``shard_map`` and ``checkify``.

- **Effects**: a ``pallas_call`` has the effects of its kernel other than the kernel's
  reads and writes of its own refs (``debug_print``, ``jax.debug.callback``, ordered
  callbacks, ...). So a call that prints is never removed as dead code, and ordered
  effects are threaded through ``jit`` in program order. A backend's kernel-local
  effects (``pallas.plugins.register_kernel_local_effect``: fences, barriers) stay
  inside, so ``jax.export`` can serialise the call where the backend is not installed.
- **shard_map**: an output varies over the manual mesh axes that any operand varies over
  and those its ``out_shape`` declares (``jax.ShapeDtypeStruct(...,
  manual_axis_type=...)``, upstream's way; ``check_vma=True`` works without it).
- **checkify**: with ``errors=checkify.user_checks`` (or any set with
  ``FailedCheckError``), ``pl.debug_check`` inside an interpreted kernel becomes a
  checkify error carrying its message and the grid point, instead of raising. (As
  outside checkify, ``debug_check`` is only traced while ``pl.enable_debug_checks`` is
  on.)
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter.grid_runner import Checks, error_table_for, interpret_pallas_call
from pallas._src.jaxpr_util import contains
from pallas._src.pallas_call import _abstract_eval, pallas_call_p
from pallas._src.primitives.debug import debug_check_p
from pallas._src.transforms.kernel_facts import is_interpreted

# Effect types that order a kernel's own instructions (fences, barriers, waits on
# asynchronous copies) and mean nothing outside it: a backend registers them so that they
# do not become effects of the pallas_call (jax.export could not serialise the call:
# their type is unknown where the artifact is loaded).
_KERNEL_LOCAL_EFFECTS: set[type] = set()


def register_kernel_local_effect(effect_type: type) -> type:
    """Keeps effects of ``effect_type`` inside the kernel (see ``call_effects``)."""
    _KERNEL_LOCAL_EFFECTS.add(effect_type)
    return effect_type


def call_effects(jaxpr, grid_names=None) -> set:
    """The effects a ``pallas_call`` of ``jaxpr`` has outside the kernel: not the
    kernel's reads and writes of its own refs, nor of refs it allocates itself
    (``jax.empty_ref`` in a kernel is scratch), nor kernel-local effects, nor the named
    axes of its own grid or mesh (``grid_names``; bound only inside the kernel)."""
    own = set(grid_names or ())
    return {e for e in jaxpr.effects if not isinstance(e, jc.JaxprInputEffect)
            and not isinstance(e, jc.InternalMutableArrayEffect)
            and type(e) not in _KERNEL_LOCAL_EFFECTS
            and not (isinstance(e, jc.NamedAxisEffect) and e.name in own)}


def _varying(avals) -> frozenset:
    out: frozenset = frozenset()
    for a in avals:
        mat = getattr(a, "manual_axis_type", None)
        if mat is not None:
            out |= mat.varying
    return out


def _effectful_abstract_eval(*avals, jaxpr, **params):
    outs = _abstract_eval(*avals, jaxpr=jaxpr, **params)
    vma = _varying(avals)
    # An out_shape may declare more (a kernel reading lax.axis_index writes per-device
    # values from replicated operands); the operands' axes are always included.
    declared = [_varying([o]) for o in params["out_avals"]]
    declared += [frozenset()] * (len(outs) - len(declared))  # (the checks' error vector)
    if vma or any(declared):
        outs = [
            jc.ShapedArray(o.shape, o.dtype, weak_type=o.weak_type,
                           sharding=jc.core.get_cur_mesh_sharding(),
                           manual_axis_type=jc.core.ManualAxisType(varying=vma | d))
            for o, d in zip(outs, declared)
        ]
    return outs, call_effects(jaxpr.jaxpr, params["grid_mapping"].grid_names)


pallas_call_p.def_effectful_abstract_eval(_effectful_abstract_eval)


# ------------------------------------------------------------------------------------
# checkify.


def _has_debug_checks(jaxpr) -> bool:
    return contains(jaxpr, lambda eqn: eqn.primitive is debug_check_p)


def _checkify_rule(error, enabled_errors, *args, **params):
    ck = jc.checkify_internal
    jaxpr, gm, checks = params["jaxpr"], params["grid_mapping"], params["checks"]
    wants = ck.FailedCheckError in enabled_errors
    if not (wants and _has_debug_checks(jaxpr.jaxpr) and is_interpreted(params)):
        return error, pallas_call_p.bind(*args, **params)
    # Run the interpreter inline with debug checks on; its error vector becomes a
    # checkify error (the message table is filled while the interpreter traces).
    run_checks = dataclasses.replace(checks or Checks(), debug=True)
    *outs, err = interpret_pallas_call(*args, jaxpr=jaxpr, grid_mapping=gm,
                                       checks=run_checks)
    table = error_table_for(jaxpr, gm)
    n = len(gm.grid)
    point = [err[1 + k] for k in range(n)]
    tb = ck.get_traceback()
    for code, msg in enumerate(table.messages, start=1):
        if "debug_check" not in msg and "out of bounds" not in msg and (
                "uninitial" not in msg):
            continue
        fmt = msg.replace("{", "{{").replace("}", "}}")
        fmt += " at grid iteration (" + ", ".join(["{}"] * n) + ("," if n == 1 else "") + ")"
        error = ck.assert_func(error, err[0] == code, ck.FailedCheckError(tb, fmt, *point))
    if checks is not None and checks.any:
        outs.append(jnp.zeros_like(err))  # reported through checkify instead
    return error, outs


jc.checkify_error_checks[pallas_call_p] = _checkify_rule
