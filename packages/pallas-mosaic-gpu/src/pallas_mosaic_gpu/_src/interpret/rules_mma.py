"""``wgmma``/``tcgen05_mma`` in GPU interpret mode: the product is computed when issued;
operand reads and the accumulator update are logged for the race detector.

A CTA pair's ``tcgen05_mma(..., collective_axis=axis)`` is issued by the leader (the
follower's issue does nothing, as upstream's lowering predicates it): each block ``j``
of the pair holds ``acc_j`` and ``a_j`` (its rows) and ``b_j`` (its columns of b), and
``acc_j += a_j @ [b_0 | b_1]``; its barrier is a commit multicast to both blocks."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_mosaic_gpu._src.interpret import pairs
from pallas_mosaic_gpu._src.interpret.access import read, write
from pallas_mosaic_gpu._src.interpret.evaluator import no_effect, register_gpu_rule
from pallas_mosaic_gpu._src.interpret.sync import barrier_of, peer_barrier, tensor_core_arrive
from pallas_mosaic_gpu._src.primitives import mma
from pallas_mosaic_gpu._src.primitives import refs as R


def _update(th, eqn, invals, accumulate=True):
    spec = eqn.params["refs"]
    (buf, flat, tree), a, b = mma.mma_operands(spec, invals,
                                               lambda bu, f, t: read(th, bu, f, t))
    entries = R.unflatten(spec, invals)
    if len(entries) > 4:  # block-scaled (tcgen05_mma(a_scale=..., b_scale=...))
        a, b = mma.scaled_operands(a, b, *(read(th, *e) for e in entries[4:6]))
    old = read(th, buf, flat, tree)
    base = old if accumulate else jnp.zeros_like(old)
    write(th, buf, flat, tree, base + mma._dot(a, b, old.dtype))


@register_gpu_rule(mma.wgmma_p)
def _wgmma(th, eqn, invals):
    _update(th, eqn, invals)
    return []


# The product is computed when issued: every wgmma has completed when waited for.
register_gpu_rule(mma.wgmma_wait_p)(no_effect)


@register_gpu_rule(mma.tcgen05_mma_p)
def _tcgen05(th, eqn, invals):
    spec = eqn.params["refs"]
    accumulate = bool(invals[R.spec_end(spec)])
    axis = eqn.params["collective_axis"]
    if axis is not None:
        _pair_mma(th, spec, invals, accumulate, axis)
        return []
    _update(th, eqn, invals, accumulate=accumulate)
    if spec[3] is not None:
        tensor_core_arrive(th, barrier_of(th, spec[3:], invals))
    return []


def _pair_mma(th, spec, invals, accumulate, axis) -> None:
    what = f"plgpu.tcgen05_mma(collective_axis={axis!r})"
    if pairs.check_pair(th, axis, what) != 0:
        return
    acc, a, b, bar = R.unflatten(spec, invals)
    if a is None:
        raise ValueError(f"{what}: a must be an SMEM or TMEM ref")
    b_full = jnp.concatenate([read(th, *pairs.peer_view(th, b, axis, j)) for j in (0, 1)],
                             axis=-1)
    for j in (0, 1):
        acc_j = pairs.peer_view(th, acc, axis, j)
        old = read(th, *acc_j)
        base = old if accumulate else jnp.zeros_like(old)
        a_j = read(th, *pairs.peer_view(th, a, axis, j))
        write(th, *acc_j, base + mma._dot(a_j, b_full, old.dtype))
    if bar is not None:
        tensor_core_arrive(th, *(peer_barrier(th, bar, axis, j) for j in (0, 1)))
