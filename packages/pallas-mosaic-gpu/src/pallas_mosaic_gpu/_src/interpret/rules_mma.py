"""``wgmma``/``tcgen05_mma`` in GPU interpret mode: the product is computed when issued;
operand reads and the accumulator update are logged for the race detector."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_mosaic_gpu._src.interpret.evaluator import register_gpu_rule
from pallas_mosaic_gpu._src.interpret.rules_core import read, write
from pallas_mosaic_gpu._src.interpret.sync import barrier_of, tensor_core_arrive
from pallas_mosaic_gpu._src.primitives import mma
from pallas_mosaic_gpu._src.primitives import refs as R


def _update(th, eqn, invals, accumulate=True):
    spec = eqn.params["refs"]
    (buf, flat, tree), a, b = mma.mma_operands(spec, invals,
                                               lambda bu, f, t: read(th, bu, f, t))
    old = read(th, buf, flat, tree)
    base = old if accumulate else jnp.zeros_like(old)
    write(th, buf, flat, tree, base + mma._dot(a, b, old.dtype))


@register_gpu_rule(mma.wgmma_p)
def _wgmma(th, eqn, invals):
    _update(th, eqn, invals)
    return []


@register_gpu_rule(mma.wgmma_wait_p)
def _wgmma_wait(th, eqn, invals):
    return []


@register_gpu_rule(mma.tcgen05_mma_p)
def _tcgen05(th, eqn, invals):
    R.check_not_collective(eqn, "tcgen05_mma")
    spec = eqn.params["refs"]
    _update(th, eqn, invals, accumulate=bool(invals[R.spec_end(spec)]))
    if spec[3] is not None:
        tensor_core_arrive(th, barrier_of(th, spec[3:], invals))
    return []
