"""``evaluate``: run a function primitive by primitive, under constraints.

Fusible kernels use it to evaluate a fusion eagerly in their own context, refusing
control flow (and, if asked, transposes) that a fused kernel would not handle.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax import lax

from pallas._src import jax_compat as jc
from pallas._src.fuser.tracing import make_jaxpr

DISALLOWED = (lax.scan_p, lax.while_p, lax.cond_p)


def evaluate(f: Callable, *, allow_transpose: bool = True) -> Callable:
    """``f``, evaluated by binding each primitive of its jaxpr in the current context."""

    def wrapped(*args, **kwargs):
        jaxpr, consts, _, out_tree = make_jaxpr(f, *args, **kwargs)
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, jax.tree.leaves((args, kwargs))))

        def read(v):
            return v.val if isinstance(v, jc.Literal) else env[v]

        for eqn in jaxpr.eqns:
            if eqn.primitive in DISALLOWED:
                raise NotImplementedError(f"Primitive {eqn.primitive} not supported.")
            if not allow_transpose and eqn.primitive is lax.transpose_p:
                raise ValueError("Transpose not allowed.")
            params = eqn.primitive.get_bind_params(eqn.params)
            with jc.source_info_util.user_context(eqn.source_info.traceback), eqn.ctx.manager:
                outs = eqn.primitive.bind(*[read(v) for v in eqn.invars], **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            env.update(zip(eqn.outvars, outs))
        return jax.tree.unflatten(out_tree, [read(v) for v in jaxpr.outvars])

    return wrapped
