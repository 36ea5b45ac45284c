"""Which kernel operands the kernel uses as DMA semaphores.

A semaphore crosses a ``pallas_call`` boundary as an array in ``pltpu.SEMAPHORE`` memory
(``out_shape=pltpu.SemaphoreType.DMA(())``, then an input with
``BlockSpec(memory_space=pltpu.SEMAPHORE)``): its array carries no record of its kind,
but Mosaic types a DMA semaphore (``!tpu.dma_semaphore``, which ``tpu.wait_dma2``
requires) apart from a regular one (``!tpu.semaphore``). The kernel's own use decides:
an operand that a DMA signals or waits on is a DMA semaphore.
"""

from __future__ import annotations

from pallas import plugins
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.primitives import dma

# Which entries of each DMA primitive's packed refs are semaphores.
_SEM_ENTRIES = {dma.dma_start_p: (2, 3), dma.dma_wait_p: (0,)}


def dma_semaphore_operands(jaxpr) -> frozenset[int]:
    """The positions among ``jaxpr.invars`` of the refs that a DMA (in ``jaxpr`` or a
    jaxpr nested in it: loops, conditionals, calls, ``run_scoped``) uses as its
    semaphore."""
    top = {v: i for i, v in enumerate(jaxpr.invars)}
    found: set[int] = set()
    _walk(jaxpr, top, found)
    return frozenset(found)


def _walk(jaxpr, env: dict, found: set) -> None:
    for eqn in jaxpr.eqns:
        entries = _SEM_ENTRIES.get(eqn.primitive)
        if entries is not None:
            end = plugins.ref_operands_end(eqn.params["refs"])
            packed = plugins.unpack_ref_operands(eqn.params["refs"], eqn.invars[:end])
            for k in entries:
                entry = packed[k] if k < len(packed) else None
                if entry is not None and _is_var(entry[0]) and entry[0] in env:
                    found.add(env[entry[0]])
            continue
        for sub, outer in _subjaxprs(eqn):
            inner = {iv: env[ov] for iv, ov in zip(sub.invars, outer)
                     if _is_var(ov) and ov in env}
            if inner:
                _walk(sub, inner, found)


def _subjaxprs(eqn):
    """(sub-jaxpr, the outer operands its invars bind, aligned) for each nested jaxpr."""
    p = eqn.params
    if eqn.primitive.name == "while":
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        carry = eqn.invars[nc + nb:]
        yield _open(p["cond_jaxpr"]), list(eqn.invars[:nc]) + list(carry)
        yield _open(p["body_jaxpr"]), list(eqn.invars[nc:nc + nb]) + list(carry)
        return
    for sub in jc.core.jaxprs_in_params(p):
        n, m = len(sub.invars), len(eqn.invars)
        if n == m:  # calls, scan, run_scoped without allocations
            yield sub, eqn.invars
        elif n == m - 1:  # cond: the branch index comes first
            yield sub, eqn.invars[1:]
        elif n > m:  # run_scoped: the captured refs, then the allocations
            yield sub, list(eqn.invars) + [None] * (n - m)


def _open(j):
    return getattr(j, "jaxpr", j)


def _is_var(v) -> bool:
    return v is not None and not hasattr(v, "val")  # a jaxpr Literal has .val
