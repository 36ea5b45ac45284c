"""``pl.get_global``: a buffer that lives for a whole kernel launch.

Each ``get_global`` equation names one buffer of the given type (in practice a
semaphore), allocated once per launch of the kernel on each device and shared by every
block and thread of it; semaphores start at zero. What "global" means is the
backend's: pallas-core's own interpreter runs grid points one after another with no
launch-wide storage, so its rule refuses, naming the backends' interpret modes.
"""

from __future__ import annotations

from typing import Any

from pallas._src import jax_compat as jc
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.memory import MemoryRef, as_memory_ref

get_global_p = jc.Primitive("get_global")
# The ref it returns is created by the equation (as jax.new_ref's): effects on it are
# not effects on a jaxpr input.
get_global_p.ref_primitive = True
get_global_p.ref_allocating = True


def get_global(what: Any) -> Any:
    """A ref of buffer type ``what`` (e.g. ``plgpu.SemaphoreType.REGULAR``) shared by the
    whole kernel launch; each call site is its own buffer, the same on every visit."""
    t = as_memory_ref(what)
    if t is None:
        raise TypeError(
            f"pl.get_global(what={what!r}): expected a buffer type such as "
            "plgpu.SemaphoreType.REGULAR or plgpu.SemaphoreType.REGULAR((n,))")
    return get_global_p.bind(what=t)


def _abstract_eval(*, what: MemoryRef):
    return what.get_ref_aval()


get_global_p.def_abstract_eval(_abstract_eval)


@register_interpret_rule(get_global_p)
def _get_global_rule(ctx, eqn, invals):
    raise NotImplementedError(
        "pl.get_global allocates a buffer for the whole kernel launch, which "
        "pallas-core's interpreter (one grid point at a time) does not model; run the "
        "kernel with its backend's interpret mode (e.g. plgpu.InterpretParams()) or "
        "lower it (mosaic_gpu)")
