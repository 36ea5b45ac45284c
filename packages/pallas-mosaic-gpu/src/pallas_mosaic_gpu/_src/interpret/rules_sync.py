"""GPU-interpret-mode rules of barriers (``barrier_arrive``/``wait``/``test``) and
semaphores (``pl.semaphore_signal``/``wait``/``read``, another device's through
``device_id=``). The barrier and semaphore states they act on are in :mod:`sync`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas.plugins import semaphore_read_p, semaphore_signal_p, semaphore_wait_p
from pallas_mosaic_gpu._src.interpret import devices
from pallas_mosaic_gpu._src.interpret.evaluator import register_gpu_rule
from pallas_mosaic_gpu._src.interpret.sync import (
    BarrierError,
    arrive,
    barrier_of,
    sem_index,
    signal,
    wait,
)
from pallas_mosaic_gpu._src.interpret.threads import Blocker
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.barriers import (
    barrier_arrive_p,
    barrier_test_p,
    barrier_wait_p,
)


@register_gpu_rule(barrier_arrive_p)
def _arrive_rule(th, eqn, invals):
    arrive(barrier_of(th, eqn.params["refs"], invals), th.release())
    return []



@register_gpu_rule(barrier_wait_p)
def _wait_rule(th, eqn, invals):
    buf = R.unflatten(eqn.params["refs"], invals)[0][0]
    space = buf.space
    if getattr(space, "kind", None) == "cluster_barrier" and space.leader_tracked:
        axes = [a for axes in space.collective_axes
                for a in ((axes,) if isinstance(axes, str) else axes)]
        if any(th.coords.get(a, 0) for a in axes):
            raise BarrierError(
                f"{buf.name} is a plgpu.ClusterBarrier(leader_tracked=True): arrivals reach "
                f"only the leader block's copy (index 0 along {axes}), so this wait by "
                f"{th.name} would never complete")
    yield from wait(th, barrier_of(th, eqn.params["refs"], invals))
    return []



@register_gpu_rule(barrier_test_p)
def _test_rule(th, eqn, invals):
    state = barrier_of(th, eqn.params["refs"], invals)
    seen = state.observed.get(th.tid, [0, 0])[1]
    return [jnp.asarray(state.completed > seen)]



def _sem_operands(eqn, invals):
    buf, *rest = invals
    n = eqn.params["tree"].num_leaves
    return buf, rest[:n], rest[n:]



@register_gpu_rule(semaphore_signal_p)
def _signal_rule(th, eqn, invals):
    p = eqn.params
    buf, idx, rest = _sem_operands(eqn, invals)
    if p["device_id_tree"].num_leaves:  # another device's copy of the semaphore
        n_dev = p["device_id_tree"].num_leaves
        device_id = jax.tree_util.tree_unflatten(p["device_id_tree"], rest[1:1 + n_dev])
        what = "pl.semaphore_signal(..., device_id=...)"
        dev = devices.peer_device(th, device_id, p["device_id_type"], what)
        buf = devices.copy_on(th, dev, buf, what)
    signal(th, buf, idx, p["tree"], rest[0])
    return []



@register_gpu_rule(semaphore_wait_p)
def _sem_wait_rule(th, eqn, invals):
    buf, idx, rest = _sem_operands(eqn, invals)
    i = sem_index(buf, idx, eqn.params["tree"])
    sync, value = buf.sync, int(rest[0])
    if sync.counts[i] < value:
        yield Blocker(lambda: sync.counts[i] >= value,
                      f"semaphore {buf.name}{list(i)} to reach {value}")
    if eqn.params["decrement"]:
        sync.counts[i] -= value
    th.acquire(sync.clocks.get(i))
    buf.value = jnp.asarray(sync.counts, buf.value.dtype)
    return []



@register_gpu_rule(semaphore_read_p)
def _sem_read_rule(th, eqn, invals):
    buf, idx, _ = _sem_operands(eqn, invals)
    i = sem_index(buf, idx, eqn.params["tree"])
    return [jnp.asarray(buf.sync.counts[i], jnp.int32)]
