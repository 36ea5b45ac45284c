"""mbarriers: ``barrier_arrive``, ``barrier_wait``, ``barrier_test``.

A barrier completes a *phase* once ``num_arrivals`` arrivals (threads calling
``barrier_arrive``, or TMA copies and ``tcgen05`` commits signalling it) have happened;
``barrier_wait`` blocks until the next phase the calling thread has not seen completes.

Reference interpreter (``interpret=True``, threads run one after another): a barrier
counts arrivals; a wait consumes one phase and reports, under the debug checks, a
wait that no arrival can satisfy. GPU interpret mode (``plgpu.InterpretParams``) runs
threads concurrently and checks phases per thread (``interpret/barriers.py``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pallas.plugins import effect_primitive
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.memory import BarrierSpace
from pallas_mosaic_gpu._src.primitives import refs as R


def _effects(*avals, refs, space):
    return {jc.WriteEffect(refs[0][0])}


barrier_arrive_p = effect_primitive("mgpu_barrier_arrive", _effects)
barrier_wait_p = effect_primitive("mgpu_barrier_wait", _effects)
barrier_test_p = jc.Primitive("mgpu_barrier_test")


def check_barrier(barrier: Any, fn: str) -> BarrierSpace:
    """The barrier space of ``barrier`` (a barrier ref indexed down to one barrier)."""
    base, _ = R.ref_and_transforms(barrier)
    space = getattr(jax.typeof(base), "memory_space", None)
    if not isinstance(space, BarrierSpace):
        raise TypeError(
            f"plgpu.{fn}: expected a barrier ref (from plgpu.Barrier or plgpu.ClusterBarrier "
            f"scratch), got a ref in memory space {space}")
    shape = R.view_aval(barrier).shape
    n = 1
    for d in shape:
        n *= d
    if n != 1:
        raise ValueError(
            f"plgpu.{fn}: Attempting to operate on barrier without indexing, but "
            f"`num_barriers = {shape[0] if len(shape) == 1 else shape}`; index it, e.g. "
            "barrier.at[i]")
    return space


def barrier_arrive(barrier: Any) -> None:
    """Arrives on ``barrier`` (one arrival of the ``num_arrivals`` a phase needs)."""
    space = check_barrier(barrier, "barrier_arrive")
    refs = R.FlatRefs(barrier)
    barrier_arrive_p.bind(*refs.operands, refs=refs.spec, space=space)


def barrier_wait(barrier: Any) -> None:
    """Blocks until the next phase of ``barrier`` (that this thread has not observed)
    completes."""
    space = check_barrier(barrier, "barrier_wait")
    refs = R.FlatRefs(barrier)
    barrier_wait_p.bind(*refs.operands, refs=refs.spec, space=space)


def barrier_test(barrier: Any) -> jax.Array:
    """Whether the next phase of ``barrier`` has completed, without waiting (bool)."""
    space = check_barrier(barrier, "barrier_test")
    refs = R.FlatRefs(barrier)
    return barrier_test_p.bind(*refs.operands, refs=refs.spec, space=space)


barrier_test_p.def_effectful_abstract_eval(
    lambda *avals, refs, space: (jc.ShapedArray((), jnp.bool_), {jc.ReadEffect(refs[0][0])}))


# -- reference interpreter rules (sequential threads) -----------------------------------


def _count(cell, flat, tree):
    return jnp.reshape(jc.get_view(cell.value, flat, tree), ())


def _set_count(cell, flat, tree, value):
    view_shape = jnp.shape(jc.get_view(cell.value, flat, tree))
    cell.value = jc.set_view(cell.value, jnp.reshape(value, view_shape), flat, tree)


def arrive_rule(ctx, eqn, invals):
    ((cell, flat, tree),) = R.unflatten(eqn.params["refs"], invals)
    _set_count(cell, flat, tree, _count(cell, flat, tree) + 1)
    return []


def wait_rule(ctx, eqn, invals):
    ((cell, flat, tree),) = R.unflatten(eqn.params["refs"], invals)
    n = eqn.params["space"].num_arrivals
    count = _count(cell, flat, tree)
    ctx.report(count >= n, f"plgpu.barrier_wait on {cell.origin} would block forever: its "
               f"phase needs {n} arrival(s) and no later thread can arrive (the reference "
               "interpreter runs threads one after another; use plgpu.InterpretParams)")
    _set_count(cell, flat, tree, jnp.maximum(count - n, 0))
    return []


def test_rule(ctx, eqn, invals):
    ((cell, flat, tree),) = R.unflatten(eqn.params["refs"], invals)
    return [_count(cell, flat, tree) >= eqn.params["space"].num_arrivals]


INTERPRET_RULES = {barrier_arrive_p: arrive_rule, barrier_wait_p: wait_rule,
                   barrier_test_p: test_rule}
