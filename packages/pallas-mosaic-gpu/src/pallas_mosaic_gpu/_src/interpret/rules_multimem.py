"""GPU-interpret-mode rules of ``multimem_store``, ``multimem_load_reduce`` and
``semaphore_signal_multicast``: with one device along the collective axes they are the
local store, load and signal (several devices are refused at trace time, see
:func:`~pallas_mosaic_gpu._src.primitives.multimem.check_single_device`)."""

from __future__ import annotations

from pallas_mosaic_gpu._src.interpret import sync
from pallas_mosaic_gpu._src.interpret.evaluator import register_gpu_rule
from pallas_mosaic_gpu._src.interpret.rules_core import read, write
from pallas_mosaic_gpu._src.primitives import multimem as M
from pallas_mosaic_gpu._src.primitives import refs as R


@register_gpu_rule(M.multimem_store_p)
def _store(th, eqn, invals):
    M.check_single_device(eqn)
    source, *rest = invals
    ((buf, flat, tree),) = R.unflatten(eqn.params["refs"], rest)
    write(th, buf, flat, tree, source)
    return []


@register_gpu_rule(M.multimem_load_reduce_p)
def _load_reduce(th, eqn, invals):
    M.check_single_device(eqn)
    ((buf, flat, tree),) = R.unflatten(eqn.params["refs"], invals)
    return [read(th, buf, flat, tree)]


@register_gpu_rule(M.semaphore_signal_multicast_p)
def _signal(th, eqn, invals):
    M.check_single_device(eqn)
    spec = eqn.params["refs"]
    ((buf, flat, tree),) = R.unflatten(spec, invals)
    sync.signal(th, buf, flat, tree, invals[R.spec_end(spec)])
    return []
