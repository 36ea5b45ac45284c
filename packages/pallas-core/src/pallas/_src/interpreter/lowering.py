"""``pallas_call_p`` lowered to HLO that runs the reference interpreter (the lowering of
``interpret=True``, of the built-in ``interpret`` backend, and of a backend's fallback)."""

from __future__ import annotations

import functools

from pallas._src import jax_compat as jc
from pallas._src.interpreter.grid_runner import interpret_pallas_call


def lower_with_interpreter(ctx, *in_nodes, jaxpr, grid_mapping, checks=None):
    """Lowers ``pallas_call`` to HLO that runs the reference interpreter.

    With ``checks`` (a ``Checks``), the last result is the checks' error vector.
    """
    fun = functools.partial(interpret_pallas_call, jaxpr=jaxpr, grid_mapping=grid_mapping,
                            checks=checks)
    # The interpreter computes one device's (or one shard_map instance's) call: it is
    # traced on plain avals, without the operands' shardings or varying manual axes.
    plain_ctx = ctx.replace(avals_in=[plain_aval(a) for a in ctx.avals_in],
                            avals_out=[plain_aval(a) for a in ctx.avals_out])
    with jc.check_vma(False):  # (its kernel was traced without them: see trace_kernel)
        outs = jc.mlir.lower_fun(fun, multiple_results=True)(plain_ctx, *in_nodes)
    if plain_ctx.tokens_out is not None:  # ordered effects inside the kernel
        ctx.set_tokens_out(plain_ctx.tokens_out)
    return outs


def plain_aval(a):
    if isinstance(a, jc.ShapedArray):
        return jc.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
    return a
