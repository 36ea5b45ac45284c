"""``program_id`` and ``num_programs``: where a program instance is in the grid."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, NamedTuple

import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.context_vars import set_for_block
from pallas._src.interpreter.rules import register_interpret_rule

program_id_p = jc.Primitive("program_id")
num_programs_p = jc.Primitive("num_programs")


# The grid of the kernel being traced, so a bad axis fails at trace time.
_tracing_grid: contextvars.ContextVar = contextvars.ContextVar("pallas_grid", default=None)


def tracing_grid(grid: tuple[int, ...]) -> contextlib.AbstractContextManager[None]:
    return set_for_block(_tracing_grid, tuple(grid))


class GridAxis(NamedTuple):
    """One axis of a :func:`grid_env`: the program's index along it and its size."""

    index: Any
    size: Any


# Grid axes given explicitly (upstream's ``pallas.core.grid_env``): program_id and
# num_programs read them instead of binding their primitives, so code that runs a kernel
# body inside another loop (a pipeline's steps) can say where in the grid it is.
_grid_env: contextvars.ContextVar = contextvars.ContextVar("pallas_grid_env", default=None)


def grid_env(env) -> contextlib.AbstractContextManager[None]:
    """Within this context, ``pl.program_id(a)`` is ``env[a].index`` and
    ``pl.num_programs(a)`` is ``env[a].size`` (``env`` a sequence of :class:`GridAxis`;
    a None entry leaves that axis to the kernel's grid)."""
    return set_for_block(_grid_env, tuple(env))


def _from_env(axis, field: str):
    env = _grid_env.get()
    if env is None or not 0 <= int(axis) < len(env) or env[int(axis)] is None:
        return None
    return getattr(env[int(axis)], field)


def _checked_axis(axis, what: str) -> int:
    axis = int(axis)
    grid = _tracing_grid.get()
    if grid is not None and not 0 <= axis < len(grid):
        raise ValueError(
            f"pl.{what}({axis}) is out of range: the kernel's grid {grid} has "
            f"{len(grid)} axes (valid axes are 0..{len(grid) - 1})"
        )
    return axis


def program_id(axis: int):
    """The index of this program instance along grid ``axis`` (an int32 scalar)."""
    given = _from_env(axis, "index")
    if given is not None:
        return given
    return program_id_p.bind(axis=_checked_axis(axis, "program_id"))


def num_programs(axis: int):
    """The size of the grid along ``axis``: a Python int when the size is static (as
    upstream), an int32 scalar when it is dynamic (or read outside a traced kernel)."""
    given = _from_env(axis, "size")
    if given is not None:
        return given
    axis = _checked_axis(axis, "num_programs")
    grid = _tracing_grid.get()
    if grid is not None and isinstance(grid[axis], int):
        return grid[axis]
    return num_programs_p.bind(axis=axis)


@program_id_p.def_abstract_eval
def _program_id_abstract_eval(*, axis):
    return jc.ShapedArray((), jnp.int32)


@num_programs_p.def_abstract_eval
def _num_programs_abstract_eval(*, axis):
    return jc.ShapedArray((), jnp.int32)


def _outside_kernel(what):
    def impl(*args, **params):
        raise RuntimeError(
            f"pl.{what} can only be used inside a Pallas kernel (a function passed to "
            f"pl.pallas_call or pl.kernel)"
        )

    return impl


program_id_p.def_impl(_outside_kernel("program_id"))
num_programs_p.def_impl(_outside_kernel("num_programs"))


def _check_axis(ctx, axis, what):
    if not 0 <= axis < len(ctx.grid_indices):
        raise ValueError(
            f"pl.{what}({axis}) is out of range for a grid of rank {len(ctx.grid)} "
            f"(grid={ctx.grid})"
        )


@register_interpret_rule(program_id_p)
def _program_id_rule(ctx, eqn, invals):
    axis = eqn.params["axis"]
    _check_axis(ctx, axis, "program_id")
    return [jnp.asarray(ctx.grid_indices[axis], jnp.int32)]


@register_interpret_rule(num_programs_p)
def _num_programs_rule(ctx, eqn, invals):
    axis = eqn.params["axis"]
    _check_axis(ctx, axis, "num_programs")
    return [jnp.asarray(ctx.grid[axis], jnp.int32)]  # traced for a dynamic grid
