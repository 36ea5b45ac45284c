"""Control flow inside kernels: pl.when, lax.fori_loop (static and dynamic bounds,
unrolled), lax.while_loop, lax.cond, lax.switch, lax.scan, pl.loop, nested loops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_conformance.registry import case, randn, sds

R, C = 16, 128


def _spec():
    return pl.BlockSpec((8, C), lambda i: (i, 0))


@case("control_flow/when_program_id", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: x.at[:8].multiply(-1.0))
def when_pid(pallas_call, x):
    """pl.when(program_id == 0) negates only the first block."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = -x_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()], out_specs=_spec())(x)


@case("control_flow/when_data_dependent", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (1, 1))),
      reference=lambda x, s: jnp.where(s[0, 0] > 0, x * 2, x))
def when_data(pallas_call, x, s):
    """pl.when on a value read from memory."""
    def kernel(x_ref, s_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(s_ref[0, 0] > 0)
        def _():
            o_ref[...] = x_ref[...] * 2

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x, s)


@case("control_flow/fori_loop_static", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: sum(x * k for k in range(5)))
def fori_static(pallas_call, x):
    """lax.fori_loop with static bounds and a carried value."""
    def kernel(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = lax.fori_loop(0, 5, lambda k, acc: acc + x * k.astype(jnp.float32),
                                   jnp.zeros_like(x))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/fori_loop_unrolled", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x * 0.5 ** 4)
def fori_unroll(pallas_call, x):
    """lax.fori_loop(..., unroll=True)."""
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.fori_loop(0, 4, lambda k, v: v * 0.5, x_ref[...], unroll=True)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


def _partial_unroll_reference(x):
    v = x
    for k in range(7):
        v = v * 0.5 + x * k
    return v


@case("control_flow/fori_loop_partially_unrolled", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=_partial_unroll_reference)
def fori_partial_unroll(pallas_call, x):
    """lax.fori_loop(0, 7, ..., unroll=3): two steps of three bodies and one step left
    over; each body uses its own index, so a wrong index in an unrolled copy or in the
    leftover step changes the result."""
    def kernel(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = lax.fori_loop(0, 7, lambda k, v: v * 0.5 + x * k.astype(jnp.float32),
                                   x, unroll=3)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/fori_loop_dynamic_bound", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: x + jnp.repeat(jnp.arange(4, dtype=jnp.float32), 8)[:, None])
def fori_dynamic(pallas_call, x):
    """A trip count that depends on program_id."""
    def kernel(x_ref, o_ref):
        n = pl.program_id(0)
        o_ref[...] = lax.fori_loop(0, n, lambda k, v: v + 1.0, x_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[_spec()], out_specs=_spec())(x)


@case("control_flow/fori_loop_ref_writes", tags={"control_flow", "indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: jnp.cumsum(x, axis=0))
def fori_refs(pallas_call, x):
    """A loop whose body reads and writes refs (a running sum over rows)."""
    def kernel(x_ref, o_ref):
        o_ref[pl.ds(0, 1), :] = x_ref[pl.ds(0, 1), :]

        def body(k, carry):
            o_ref[pl.ds(k, 1), :] = o_ref[pl.ds(k - 1, 1), :] + x_ref[pl.ds(k, 1), :]
            return carry

        lax.fori_loop(1, R, body, 0)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/while_loop", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x * 8.0)
def while_loop(pallas_call, x):
    """lax.while_loop with a tuple carry."""
    def kernel(x_ref, o_ref):
        def cond(c):
            return c[0] < 3

        def body(c):
            return c[0] + 1, c[1] * 2

        o_ref[...] = lax.while_loop(cond, body, (0, x_ref[...]))[1]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/while_loop_data_dependent", tags={"control_flow"},
      inputs=lambda rng: (jnp.abs(randn(rng, (8, C))) + 1.0,),
      reference=lambda x: jnp.full((1, 1), jnp.ceil(jnp.log2(1000.0 / jnp.sum(x))).clip(0),
                                   jnp.int32))
def while_data(pallas_call, x):
    """A while_loop whose trip count depends on the data."""
    def kernel(x_ref, o_ref):
        total = jnp.sum(x_ref[...])

        def cond(c):
            return c[1] < 1000.0

        def body(c):
            return c[0] + 1, c[1] * 2

        o_ref[0, 0] = lax.while_loop(cond, body, (jnp.int32(0), total))[0]

    return pallas_call(kernel, out_shape=sds((1, 1), jnp.int32))(x)


@case("control_flow/cond", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: jnp.concatenate([jnp.sin(x[:8]), jnp.cos(x[8:16]), jnp.sin(x[16:24]),
                                           jnp.cos(x[24:])]))
def cond(pallas_call, x):
    """lax.cond on the parity of program_id."""
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.cond(pl.program_id(0) % 2 == 0, jnp.sin, jnp.cos, x_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[_spec()], out_specs=_spec())(x)


@case("control_flow/cond_ref_effects", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (1, 1))),
      reference=lambda x, s: jnp.where(s[0, 0] > 0, x + 1, x - 1))
def cond_refs(pallas_call, x, s):
    """lax.cond whose branches write to the output ref."""
    def kernel(x_ref, s_ref, o_ref):
        def yes():
            o_ref[...] = x_ref[...] + 1

        def no():
            o_ref[...] = x_ref[...] - 1

        lax.cond(s_ref[0, 0] > 0, yes, no)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x, s)


@case("control_flow/switch", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (24, C)),),
      reference=lambda x: jnp.concatenate([x[:8] + 1, x[8:16] * 2, -x[16:]]))
def switch(pallas_call, x):
    """lax.switch on program_id."""
    def kernel(x_ref, o_ref):
        o_ref[...] = lax.switch(pl.program_id(0),
                                [lambda v: v + 1, lambda v: v * 2, lambda v: -v], x_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(3,),
                       in_specs=[_spec()], out_specs=_spec())(x)


@case("control_flow/scan", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.cumsum(x, axis=0))
def scan(pallas_call, x):
    """lax.scan over the rows of a block."""
    def kernel(x_ref, o_ref):
        def step(acc, row):
            acc = acc + row
            return acc, acc

        o_ref[...] = lax.scan(step, jnp.zeros((C,), jnp.float32), x_ref[...])[1]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/pl_loop", tags={"control_flow", "indexing"},
      inputs=lambda rng: (randn(rng, (R, C)),), reference=lambda x: x[::-1])
def pl_loop(pallas_call, x):
    """The pl.loop decorator: a side-effecting loop over rows."""
    def kernel(x_ref, o_ref):
        @pl.loop(0, R)
        def _(k):
            o_ref[pl.ds(k, 1), :] = x_ref[pl.ds(R - 1 - k, 1), :]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/nested_loops", tags={"control_flow", "indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x * 12.0)
def nested(pallas_call, x):
    """A fori_loop inside a fori_loop, accumulating into the output ref."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        def outer(i, c):
            def inner(j, c2):
                o_ref[...] += x_ref[...]
                return c2

            return lax.fori_loop(0, 4, inner, c)

        lax.fori_loop(0, 3, outer, 0)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/num_programs", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: x.at[8:].add(100.0))
def num_programs(pallas_call, x):
    """pl.num_programs: the last program adds 100."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
        def _():
            o_ref[...] += 100.0

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec()], out_specs=_spec())(x)


@case("control_flow/grid_3d_revisit", tags={"control_flow", "sequential_grid"},
      inputs=lambda rng: (randn(rng, (2, 16, 256)),),
      reference=lambda x: x.reshape(2, 16, 2, 128).sum(axis=2))
def grid_3d(pallas_call, x):
    """A 3-D grid whose innermost axis revisits the same output block."""
    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    return pallas_call(kernel, out_shape=sds((2, 16, C), x.dtype), grid=(2, 2, 2),
                       in_specs=[pl.BlockSpec((None, 8, C), lambda b, i, k: (b, i, k))],
                       out_specs=pl.BlockSpec((None, 8, C), lambda b, i, k: (b, i, 0)))(x)


