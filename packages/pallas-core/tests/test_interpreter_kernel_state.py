"""Declared kernel state (``pallas.plugins.declare_kernel_state``): a backend's per-core
state lives in a cell that the interpreter threads through control flow and carries
across grid steps (here a counter: ``start(v)`` resets it, ``tick()`` returns it and adds
one)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
import pallas.plugins
from pallas._src import jax_compat as jc


class _CounterEffect(jc.effects.Effect):
    pass


for _set in (jc.effects.control_flow_allowed_effects, jc.effects.lowerable_effects):
    _set.add_type(_CounterEffect)
pallas.plugins.register_kernel_local_effect(_CounterEffect)

start_p = jc.Primitive("test_counter_start")
start_p.multiple_results = True
start_p.def_effectful_abstract_eval(lambda v: ([], {_CounterEffect()}))
tick_p = jc.Primitive("test_counter_tick")
tick_p.def_effectful_abstract_eval(
    lambda: (jc.ShapedArray((), jnp.int32), {_CounterEffect()}))

_NAME = "test.counter"
pallas.plugins.declare_kernel_state(_NAME, lambda: jnp.zeros((), jnp.int32),
                                    reads=(tick_p,), resets=(start_p,))


@pallas.plugins.register_interpret_rule(start_p)
def _start_rule(ctx, eqn, invals):
    ctx.kernel_state(_NAME).value = jnp.asarray(invals[0], jnp.int32)
    return []


@pallas.plugins.register_interpret_rule(tick_p)
def _tick_rule(ctx, eqn, invals):
    cell = ctx.kernel_state(_NAME)
    n = cell.value
    cell.value = n + 1
    return [n]


def _call(body, n_steps, width=4):
    spec = pl.BlockSpec((1, width), lambda i: (i, 0))
    return np.asarray(pl.pallas_call(
        body, grid=(n_steps,), out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((n_steps, width), jnp.int32), interpret=True)())


def test_the_state_is_threaded_through_loops_and_conditions():
    def body(o_ref):
        start_p.bind(10 * pl.program_id(0))

        def step(j, c):
            o_ref[0, j] = tick_p.bind()
            return c

        lax.fori_loop(0, 2, step, 0)

        @pl.when(pl.program_id(0) == 1)
        def _():
            tick_p.bind()  # only in step 1: its next tick is one further on

        o_ref[0, 2] = tick_p.bind()
        o_ref[0, 3] = lax.while_loop(lambda k: k < 3, lambda k: tick_p.bind(), jnp.int32(0))

    np.testing.assert_array_equal(_call(body, 2), [[0, 1, 2, 3], [10, 11, 13, 14]])


def test_the_state_carries_across_grid_steps():
    def body(o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            start_p.bind(100)

        o_ref[0, 0] = tick_p.bind()
        o_ref[0, 1] = tick_p.bind()
        o_ref[0, 2] = pl.program_id(0)
        o_ref[0, 3] = 0

    out = _call(body, 3)
    np.testing.assert_array_equal(out[:, :2], [[100, 101], [102, 103], [104, 105]])
