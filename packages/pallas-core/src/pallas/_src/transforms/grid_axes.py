"""Rewriting a kernel jaxpr so that its grid axes move (batching, backward kernels).

``program_id(i)`` and ``num_programs(i)`` name grid axes by position. When ``vmap``
prepends a grid axis, every such reference inside the kernel (including inside the
sub-jaxprs of ``cond``/``while``/``scan``/``pjit``/``custom_jvp``/``run_scoped`` ...)
must move by one; when a backward kernel reorders the grid, each moves to its axis's
new position. Backends whose own primitives name grid axes register a rule in
:data:`grid_axis_param_rules`: ``rule(params, remap) -> params``, where ``remap`` maps an
old axis position to the new one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pallas._src import jax_compat as jc
from pallas._src.jaxpr_util import contains
from pallas._src.primitives.grid import num_programs_p, program_id_p

# primitive -> fn(params, remap) -> new params, for primitives that name grid axes.
grid_axis_param_rules: dict[Any, Callable[[dict, Callable[[int], int]], dict]] = {}


def _remap_axis(params, remap):
    return {**params, "axis": remap(params["axis"])}


grid_axis_param_rules[program_id_p] = _remap_axis
grid_axis_param_rules[num_programs_p] = _remap_axis


def _map_param(v, fn):
    if isinstance(v, jc.ClosedJaxpr):
        new = fn(v.jaxpr)
        return v if new is v.jaxpr else jc.ClosedJaxpr(new, v.consts)
    if isinstance(v, jc.Jaxpr):
        return fn(v)
    if isinstance(v, tuple) and any(isinstance(x, (jc.ClosedJaxpr, jc.Jaxpr)) for x in v):
        return tuple(_map_param(x, fn) for x in v)
    if isinstance(v, list) and any(isinstance(x, (jc.ClosedJaxpr, jc.Jaxpr)) for x in v):
        return [_map_param(x, fn) for x in v]
    return v


def uses_grid_axes(jaxpr) -> bool:
    """Whether ``jaxpr`` (a Jaxpr) refers to grid axes by position anywhere."""
    return contains(jaxpr, lambda eqn: eqn.primitive in grid_axis_param_rules)


def remap_grid_axes(jaxpr, remap: Callable[[int], int]):
    """``jaxpr`` (a Jaxpr) with every positional grid axis ``a`` moved to ``remap(a)``."""
    if not uses_grid_axes(jaxpr):
        return jaxpr
    fn = lambda j: remap_grid_axes(j, remap)  # noqa: E731
    eqns = []
    for eqn in jaxpr.eqns:
        rule = grid_axis_param_rules.get(eqn.primitive)
        if rule is not None:
            params = rule(dict(eqn.params), remap)
        else:
            params = {k: _map_param(v, fn) for k, v in eqn.params.items()}
        eqns.append(eqn.replace(params=params))
    return jaxpr.replace(eqns=eqns)


def shift_grid_axes(jaxpr, shift: int):
    """``jaxpr`` (a Jaxpr) with every positional grid axis moved by ``shift``."""
    return remap_grid_axes(jaxpr, lambda a: a + shift)


def shift_grid_axes_closed(closed, shift: int):
    new = shift_grid_axes(closed.jaxpr, shift)
    return closed if new is closed.jaxpr else jc.ClosedJaxpr(new, closed.consts)


def reverse_program_ids(jaxpr, grid):
    """``jaxpr`` (a Jaxpr) run on the grid in reverse order: every ``program_id(a)``
    becomes ``grid[a] - 1 - program_id(a)``, at any depth (backward kernels that sweep
    a sequential axis backwards). Raises ``ValueError`` for other primitives that name
    grid axes (a backend's), which cannot be reversed this way."""
    if not uses_grid_axes(jaxpr):
        return jaxpr
    import numpy as np
    from jax import lax

    fn = lambda j: reverse_program_ids(j, grid)  # noqa: E731
    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is program_id_p:
            (out,) = eqn.outvars
            if isinstance(out, jc.DropVar):
                eqns.append(eqn)
                continue
            raw = jc.Var(out.aval)
            last = jc.Literal(np.asarray(grid[eqn.params["axis"]] - 1, out.aval.dtype),
                              out.aval)
            eqns.append(eqn.replace(outvars=[raw]))
            eqns.append(jc.new_jaxpr_eqn([last, raw], [out], lax.sub_p, {}, set(),
                                         eqn.source_info))
        elif eqn.primitive is num_programs_p:
            eqns.append(eqn)
        elif eqn.primitive in grid_axis_param_rules:
            raise ValueError(f"{eqn.primitive} names a grid axis and cannot run reversed")
        else:
            eqns.append(eqn.replace(
                params={k: _map_param(v, fn) for k, v in eqn.params.items()}))
    return jaxpr.replace(eqns=eqns)


def offset_grid_indices(jaxpr, offsets, grid, names=()):
    """``jaxpr`` (a Jaxpr) run on one device's part of a split grid: ``program_id(a)``
    (and ``lax.axis_index`` of a named grid axis) becomes ``offsets[a] + program_id(a)``
    and ``num_programs(a)`` the global ``grid[a]``, at any depth, so index arithmetic in
    the kernel keeps its global meaning."""
    import numpy as np
    from jax import lax

    names = tuple(names or ())

    def lit(value, aval):
        return jc.Literal(np.asarray(value, aval.dtype), aval)

    def rewrite(j):
        eqns = []
        for eqn in j.eqns:
            axis = None
            if eqn.primitive in (program_id_p, num_programs_p):
                axis = eqn.params["axis"]
            elif eqn.primitive is jc.axis_index_p and names:
                an = eqn.params.get("axis_name")
                an = an if isinstance(an, tuple) else (an,)
                if len(an) == 1 and an[0] in names:
                    axis = names.index(an[0])
            (out,) = eqn.outvars if axis is not None else (None,)
            if axis is None or axis not in offsets or isinstance(out, jc.DropVar):
                eqns.append(eqn.replace(
                    params={k: _map_param(v, rewrite) for k, v in eqn.params.items()}))
            elif eqn.primitive is num_programs_p:
                eqns.append(jc.new_jaxpr_eqn([lit(grid[axis], out.aval)], [out],
                                             lax.convert_element_type_p,
                                             {"new_dtype": out.aval.dtype, "weak_type": False,
                                              "sharding": None}, set(), eqn.source_info))
            else:
                raw = jc.Var(out.aval)
                eqns.append(eqn.replace(outvars=[raw]))
                eqns.append(jc.new_jaxpr_eqn([lit(offsets[axis], out.aval), raw], [out],
                                             lax.add_p, {}, set(), eqn.source_info))
        return j.replace(eqns=eqns)

    return rewrite(jaxpr)
