"""``host_call_p``: a host callback that gets its operands as the numpy arrays XLA hands
over, for interpret modes that simulate several devices at once.

``jax.experimental.io_callback`` first places its operands on a JAX device. Under
``shard_map``, a simulation whose devices wait for one another inside their callbacks
would then read values placed on a device whose execution is blocked in its own
callback: a hang. This primitive skips that placement; it is otherwise an unordered
``io_callback`` (never removed as dead code, allowed in control flow and ``shard_map``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from pallas._src import jax_compat as jc

host_call_p = jc.Primitive("pallas_host_call")
host_call_p.multiple_results = True


@host_call_p.def_effectful_abstract_eval
def _abstract_eval(*avals, fn, result_avals):
    del avals, fn
    return list(result_avals), {jc.io_effect()}


def _lowering(ctx, *operands, fn, result_avals):
    del result_avals

    def run(*args):
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            return tuple(np.asarray(x) for x in fn(*args))

    return jc.emit_host_callback(ctx, run, operands)


jc.mlir.register_lowering(host_call_p, _lowering, cacheable=False)
host_call_p.def_impl(
    lambda *args, **params: jc.dispatch_apply_primitive(host_call_p, *args, **params))


def host_call(fn: Callable[..., Sequence[np.ndarray]], result_avals: Sequence, *args) -> list:
    """``fn(*numpy args)`` on the host (once per device under a manual ``shard_map``),
    returning arrays of ``result_avals`` (anything with ``shape`` and ``dtype``)."""
    avals = tuple(jc.ShapedArray(tuple(a.shape), a.dtype) for a in result_avals)
    return host_call_p.bind(*args, fn=fn, result_avals=avals)
