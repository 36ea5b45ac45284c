"""``tpu_interpret_call_p``: one device's part of a kernel, run by a host callback.

Like an unordered ``io_callback``, but the callback gets the operands as the numpy arrays
XLA passes to the host. ``io_callback`` first places them on a JAX device and the
simulation would turn them back into numpy; with several devices under ``shard_map``
blocked in their callbacks (waiting for one another at the simulation's barriers), that
conversion can wait forever behind the computation that runs the callback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from pallas_tpu._src import jax_compat as jc

tpu_interpret_call_p = jc.Primitive("tpu_interpret_call")
tpu_interpret_call_p.multiple_results = True


@tpu_interpret_call_p.def_effectful_abstract_eval
def _abstract_eval(*avals, fn, result_avals):
    del avals, fn
    return list(result_avals), {jc.io_effect()}


def _lowering(ctx, *operands, fn, result_avals):
    del result_avals

    def run(*args):
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            return tuple(fn(*args))

    return jc.emit_host_callback(ctx, run, operands)


jc.mlir.register_lowering(tpu_interpret_call_p, _lowering, cacheable=False)
tpu_interpret_call_p.def_impl(
    lambda *args, **params: jc.apply_primitive(tpu_interpret_call_p, *args, **params))


def tpu_interpret_call(fn: Callable[..., Sequence[np.ndarray]], result_avals, *args):
    """Binds the primitive: ``fn(*numpy args)`` on each device, returning ``result_avals``."""
    avals = tuple(jc.ShapedArray(tuple(a.shape), a.dtype) for a in result_avals)
    return tpu_interpret_call_p.bind(*args, fn=fn, result_avals=avals)
