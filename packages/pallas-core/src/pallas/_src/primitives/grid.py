"""``program_id`` and ``num_programs``: where a program instance is in the grid."""

from __future__ import annotations

import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter.rules import register_interpret_rule

program_id_p = jc.Primitive("program_id")
num_programs_p = jc.Primitive("num_programs")


def program_id(axis: int):
    """The index of this program instance along grid ``axis`` (an int32 scalar)."""
    return program_id_p.bind(axis=int(axis))


def num_programs(axis: int):
    """The size of the grid along ``axis`` (an int32 scalar)."""
    return num_programs_p.bind(axis=int(axis))


@program_id_p.def_abstract_eval
def _program_id_abstract_eval(*, axis):
    return jc.ShapedArray((), jnp.int32)


@num_programs_p.def_abstract_eval
def _num_programs_abstract_eval(*, axis):
    return jc.ShapedArray((), jnp.int32)


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
    return [jnp.int32(ctx.grid[axis])]
