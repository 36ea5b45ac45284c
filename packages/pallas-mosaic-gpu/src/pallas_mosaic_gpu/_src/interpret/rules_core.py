"""GPU-interpret-mode rules of JAX's ref primitives and pallas-core's primitives that
depend on the thread: reads and writes (logged for races, bounds-checked), grid and
axis indices, ``run_scoped`` (collective allocations), debug output. The reads and writes
themselves (resolved, bounds-checked, logged) are in :mod:`access`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas.plugins import (
    axis_index_p,
    debug_check_p,
    debug_print_p,
    delay_p,
    get_global_p,
    multiple_of_p,
    num_programs_p,
    program_id_p,
    run_scoped_p,
)
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.interpret.access import read, write
from pallas_mosaic_gpu._src.interpret.evaluator import eval_jaxpr, no_effect, register_gpu_rule
from pallas_mosaic_gpu._src.interpret.memory import (
    Buffer,
    fill_value,
)


@register_gpu_rule(jc.get_p)
def _get(th, eqn, invals):
    buf, *idx = invals
    return [read(th, buf, idx, eqn.params["tree"])]


@register_gpu_rule(jc.swap_p)
def _swap(th, eqn, invals):
    buf, val, *idx = invals
    tree = eqn.params["tree"]
    old = read(th, buf, idx, tree)
    write(th, buf, idx, tree, val)
    return [old]


@register_gpu_rule(jc.addupdate_p)
def _addupdate(th, eqn, invals):
    buf, val, *idx = invals
    tree = eqn.params["tree"]
    write(th, buf, idx, tree, read(th, buf, idx, tree) + val)
    return []


def _axis(th, axis: int, what: str) -> int:
    if not 0 <= axis < len(th.grid):
        raise ValueError(f"{what}({axis}): the kernel has {len(th.grid)} grid axes")
    return axis


@register_gpu_rule(program_id_p)
def _program_id(th, eqn, invals):
    return [jnp.int32(th.grid_indices[_axis(th, eqn.params["axis"], "program_id")])]


@register_gpu_rule(num_programs_p)
def _num_programs(th, eqn, invals):
    return [jnp.int32(th.grid[_axis(th, eqn.params["axis"], "num_programs")])]


@register_gpu_rule(axis_index_p)
def _axis_index(th, eqn, invals):
    name = eqn.params["axis_name"]
    if name in th.coords:
        return [jnp.int32(th.coords[name])]
    if name in th.launch.outer_axes:
        return [jnp.int32(th.launch.outer_axes[name])]
    raise NameError(f"unbound axis name: {name!r} (the kernel's axes are "
                    f"{list(th.coords)}; enclosing map axes {list(th.launch.outer_axes)})")


@register_gpu_rule(run_scoped_p)
def _run_scoped(th, eqn, invals):
    p = eqn.params
    axes = tuple(p.get("collective_axes") or ())
    bufs = [th.launch.allocate(th, t, f"run_scoped buffer {i} ({t.memory_space})",
                               (id(eqn), i), axes)
            for i, t in enumerate(p["types"])]
    return (yield from eval_jaxpr(th, p["jaxpr"], (), [*invals, *bufs]))


@register_gpu_rule(get_global_p)
def _get_global(th, eqn, invals):
    """``pl.get_global(t)``: one buffer per call site for the whole launch, shared by
    every block and thread (semaphores start at zero)."""
    return [th.launch.global_buffer(("__global__", id(eqn)), eqn.params["what"])]


@register_gpu_rule(jc.run_state_p)
def _run_state(th, eqn, invals):
    """``pl.run_state(f)(init)``: ``f`` runs on fresh buffers (an accumulator from
    ``plgpu.ACC.init(x)`` starts at ``x``); their final values are the results. Refs
    ``f`` closes over (kernel refs) are passed through as they are."""
    jaxpr = eqn.params["jaxpr"]
    given = iter(invals)
    bufs, fresh = [], []
    for i, (v, initialized) in enumerate(zip(jaxpr.invars, eqn.params["is_initialized"])):
        x = next(given) if initialized else None
        if isinstance(x, Buffer):
            bufs.append(x)
            fresh.append(False)
            continue
        aval = v.aval
        value = (jnp.asarray(x, aval.dtype) if initialized else jnp.full(
            aval.shape, fill_value(aval.dtype, th.launch.params.uninitialized_memory)))
        bufs.append(Buffer(f"run_state buffer {i}", getattr(aval, "memory_space", None),
                           value))
        fresh.append(True)
    yield from eval_jaxpr(th, jaxpr, (), bufs)
    return [b.value if new else b for b, new in zip(bufs, fresh)]


@register_gpu_rule(debug_print_p)
def _debug_print(th, eqn, invals):
    print(eqn.params["fmt"].format(*[jax.device_get(x) for x in invals]))
    return []


@register_gpu_rule(debug_check_p)
def _debug_check(th, eqn, invals):
    if not bool(invals[0]):
        raise AssertionError(f"{eqn.params['message']} ({th.name}, at {th.site})")
    return []


@register_gpu_rule(multiple_of_p)
def _multiple_of(th, eqn, invals):
    return [invals[0]]


register_gpu_rule(delay_p)(no_effect)  # interpreted threads need no delays
