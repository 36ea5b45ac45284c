"""Primitives that order or hint but compute nothing: register reallocation
(``set_max_registers``), programmatic dependent launch (``griddepcontrol_*``), L2
prefetch (``async_prefetch``) and the TMEM fences (``commit_tmem``, ``wait_load_tmem``).

Each is its own primitive (the lowering emits the instruction); both interpreters run
them as no-ops, which is their meaning for the values a kernel computes.
"""

from __future__ import annotations

from typing import Any, Literal

from pallas.plugins import effect_primitive
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.primitives import refs as R


def _hint(name: str) -> Any:
    return effect_primitive(name, {jc.gpu_effect})


set_max_registers_p = _hint("mgpu_set_max_registers")
griddepcontrol_launch_dependents_p = _hint("mgpu_griddepcontrol_launch_dependents")
griddepcontrol_wait_p = _hint("mgpu_griddepcontrol_wait")
async_prefetch_p = _hint("mgpu_async_prefetch")
commit_tmem_p = _hint("mgpu_commit_tmem")
wait_load_tmem_p = _hint("mgpu_wait_load_tmem")


def set_max_registers(n: int, *, action: Literal["increase", "decrease"]) -> None:
    """Asks for ``n`` registers per thread for this warpgroup (warp specialisation)."""
    if action not in ("increase", "decrease"):
        raise ValueError(f"plgpu.set_max_registers(action={action!r}): must be 'increase' or "
                         "'decrease'")
    if not isinstance(n, int) or not 24 <= n <= 256 or n % 8:
        raise ValueError(f"plgpu.set_max_registers(n={n!r}): must be a multiple of 8 in "
                         "[24, 256]")
    set_max_registers_p.bind(n=n, action=action)


def griddepcontrol_launch_dependents() -> None:
    """Lets the next kernel in the stream start launching (programmatic dependent
    launch)."""
    griddepcontrol_launch_dependents_p.bind()


def griddepcontrol_wait() -> None:
    """Waits until the kernels this one depends on have finished and flushed memory."""
    griddepcontrol_wait_p.bind()


def async_prefetch(ref: Any, *, collective_axes: Any = None, leader_tracked: Any = None
                   ) -> None:
    """Prefetches ``ref`` (a GMEM view) into L2."""
    refs = R.FlatRefs(ref)
    axes = () if collective_axes is None else (
        (collective_axes,) if isinstance(collective_axes, str) else tuple(collective_axes))
    async_prefetch_p.bind(*refs.operands, refs=refs.spec, collective_axes=axes,
                          leader_tracked=leader_tracked)


def commit_tmem() -> None:
    """Makes this thread's TMEM stores visible to later ``tcgen05_mma``s."""
    commit_tmem_p.bind()


def wait_load_tmem() -> None:
    """Waits for this thread's ``async_load_tmem``s to complete."""
    wait_load_tmem_p.bind()


HINTS = (set_max_registers_p, griddepcontrol_launch_dependents_p, griddepcontrol_wait_p,
         async_prefetch_p, commit_tmem_p, wait_load_tmem_p)
INTERPRET_RULES = {p: (lambda ctx, eqn, invals: []) for p in HINTS}
