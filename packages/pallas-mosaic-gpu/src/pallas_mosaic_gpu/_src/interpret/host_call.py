"""``gpu_interpret_call_p``: one device's part of a kernel that reaches other devices,
run by a host callback that gets its operands as the numpy arrays XLA hands over.

``jax.pure_callback`` first places the operands on the callback's JAX device; another
device's simulation reading values derived from them then waits for that device, whose
execution is blocked in its own callback (waiting for the other device): a hang.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from pallas_mosaic_gpu._src import jax_compat as jc

gpu_interpret_call_p = jc.Primitive("mgpu_interpret_call")
gpu_interpret_call_p.multiple_results = True


@gpu_interpret_call_p.def_effectful_abstract_eval
def _abstract_eval(*avals, fn, result_avals):
    del avals, fn
    return list(result_avals), {jc.io_effect()}


def _lowering(ctx, *operands, fn, result_avals):
    del result_avals

    def run(*args):
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            return tuple(np.asarray(x) for x in fn(*args))

    return jc.emit_host_callback(ctx, run, operands)


jc.mlir.register_lowering(gpu_interpret_call_p, _lowering, cacheable=False)
gpu_interpret_call_p.def_impl(
    lambda *args, **params: jc.apply_primitive(gpu_interpret_call_p, *args, **params))


def gpu_interpret_call(fn: Callable[..., Sequence[np.ndarray]], result_avals, *args):
    """``fn(*numpy args)`` on each device, returning arrays of ``result_avals``."""
    avals = tuple(jc.ShapedArray(tuple(a.shape), a.dtype) for a in result_avals)
    return gpu_interpret_call_p.bind(*args, fn=fn, result_avals=avals)
