"""GPU-interpret-mode rules of ``multimem_store``, ``multimem_load_reduce`` and
``semaphore_signal_multicast``: they address the same allocation on every device along
``collective_axes`` (see :mod:`.devices`): a store writes each device's copy, a
load-reduce reads every copy and combines them, a multicast signal adds to each
device's semaphore. With one device along the axes they are the local store, load and
signal."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from pallas_mosaic_gpu._src.interpret import devices, sync
from pallas_mosaic_gpu._src.interpret.access import read, write
from pallas_mosaic_gpu._src.interpret.evaluator import register_gpu_rule
from pallas_mosaic_gpu._src.primitives import multimem as M
from pallas_mosaic_gpu._src.primitives import refs as R

_COMBINE = {"add": jnp.add, "min": jnp.minimum, "max": jnp.maximum,
            "and": jnp.bitwise_and, "or": jnp.bitwise_or, "xor": jnp.bitwise_xor}


def _copies(th, eqn, buf):
    """``buf`` on every device along the primitive's collective axes (in device order)."""
    what = f"plgpu.{M.NAMES[eqn.primitive]}"
    devs = devices.devices_along(th, eqn.params["collective_axes"], what)
    return [devices.copy_on(th, d, buf, what) for d in devs]


@register_gpu_rule(M.multimem_store_p)
def _store(th, eqn, invals):
    source, *rest = invals
    ((buf, flat, tree),) = R.unflatten(eqn.params["refs"], rest)
    for copy in _copies(th, eqn, buf):
        write(th, copy, flat, tree, source)
    return []


@register_gpu_rule(M.multimem_load_reduce_p)
def _load_reduce(th, eqn, invals):
    ((buf, flat, tree),) = R.unflatten(eqn.params["refs"], invals)
    values = [read(th, copy, flat, tree) for copy in _copies(th, eqn, buf)]
    out = functools.reduce(_COMBINE[eqn.params["reduction_op"]], values)
    return [jnp.asarray(out, values[0].dtype)]


@register_gpu_rule(M.semaphore_signal_multicast_p)
def _signal(th, eqn, invals):
    spec = eqn.params["refs"]
    ((buf, flat, tree),) = R.unflatten(spec, invals)
    for copy in _copies(th, eqn, buf):
        sync.signal(th, copy, flat, tree, invals[R.spec_end(spec)])
    return []
