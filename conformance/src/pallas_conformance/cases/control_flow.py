"""Control flow inside kernels: pl.when (nested too), lax.fori_loop (static and dynamic
bounds, bounds read from memory, unrolled, tuple carries), lax.while_loop (trip counts
that differ per program or read refs), lax.cond (several operands and results, inside
loops and around them), lax.switch (on program_id and on data), lax.scan (reversed
too), pl.loop, nested loops, program_id/num_programs.

Blocks are (8, 128).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
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


def _rows(x):
    return [x[i:i + 8] for i in range(0, x.shape[0], 8)]


def _cond_multi_ref(x, y):
    outs = []
    for a, b in zip(_rows(x), _rows(y)):
        if jnp.sum(a) > jnp.sum(b):
            outs.append((a - b, jnp.full((8, 1), 1.0)))
        else:
            outs.append((a * b, jnp.full((8, 1), -1.0)))
    return (jnp.concatenate([o[0] for o in outs]), jnp.concatenate([o[1] for o in outs]))


@case("control_flow/cond_multiple_operands", tags={"control_flow", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (32, C)), randn(rng, (32, C))),
      reference=_cond_multi_ref)
def cond_multi(pallas_call, x, y):
    """lax.cond with two operands and a tuple of two results, on a data-dependent
    predicate that differs per program."""
    def kernel(x_ref, y_ref, o_ref, s_ref):
        a, b = x_ref[...], y_ref[...]
        r, s = lax.cond(jnp.sum(a) > jnp.sum(b),
                        lambda u, v: (u - v, jnp.full((8, 1), 1.0, jnp.float32)),
                        lambda u, v: (u * v, jnp.full((8, 1), -1.0, jnp.float32)), a, b)
        o_ref[...] = r
        s_ref[...] = s

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds((32, 1), x.dtype)),
                       grid=(4,), in_specs=[_spec(), _spec()],
                       out_specs=(_spec(), pl.BlockSpec((8, 1), lambda i: (i, 0))))(x, y)


def _cond_in_loop_ref(x):
    acc = jnp.zeros((C,), jnp.float32)
    for i in range(8):
        row = x[i]
        acc = acc + row if float(row[0]) > 0 else acc - 2 * row
    return acc[None, :]


@case("control_flow/cond_inside_fori", tags={"control_flow", "indexing"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=_cond_in_loop_ref,
      tolerance={"float32": (1e-5, 1e-5)})
def cond_in_fori(pallas_call, x):
    """A lax.cond per iteration of a fori_loop, on a scalar read from the ref."""
    def kernel(x_ref, o_ref):
        def body(i, acc):
            row = x_ref[pl.ds(i, 1), :]
            return lax.cond(x_ref[i, 0] > 0, lambda: acc + row, lambda: acc - 2 * row)

        o_ref[...] = lax.fori_loop(0, 8, body, jnp.zeros((1, C), jnp.float32))

    return pallas_call(kernel, out_shape=sds((1, C), x.dtype))(x)


@case("control_flow/fori_inside_cond", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: jnp.concatenate(
          [r * 2.0 ** 3 if i % 2 == 0 else r + 5.0 for i, r in enumerate(_rows(x))]))
def fori_in_cond(pallas_call, x):
    """A fori_loop inside one branch of a lax.cond."""
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = lax.cond(pl.program_id(0) % 2 == 0,
                              lambda: lax.fori_loop(0, 3, lambda i, c: c * 2.0, v),
                              lambda: v + 5.0)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[_spec()], out_specs=_spec())(x)


def _halvings(x):
    """Per (8, 128) block: how many halvings bring max|x| below 1, and the halved block."""
    outs, counts = [], []
    for r in _rows(x):
        m, n = float(jnp.max(jnp.abs(r))), 0
        while m >= 1.0:
            m, n = m / 2, n + 1
        outs.append(r / 2.0 ** n)
        counts.append(jnp.full((8, 1), n, jnp.int32))
    return jnp.concatenate(outs), jnp.concatenate(counts)


@case("control_flow/while_per_program_trip_count", tags={"control_flow", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (32, C)) * jnp.repeat(
          jnp.asarray([0.1, 3.0, 40.0, 900.0], jnp.float32), 8)[:, None],),
      reference=_halvings)
def while_per_program(pallas_call, x):
    """A while_loop whose trip count differs for every program (0 to 12 halvings)."""
    def kernel(x_ref, o_ref, n_ref):
        def cond(c):
            return jnp.max(jnp.abs(c[1])) >= 1.0

        def body(c):
            return c[0] + 1, c[1] * 0.5

        n, v = lax.while_loop(cond, body, (jnp.int32(0), x_ref[...]))
        o_ref[...] = v
        n_ref[...] = jnp.full((8, 1), n, jnp.int32)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds((32, 1), jnp.int32)),
                       grid=(4,), in_specs=[_spec()],
                       out_specs=(_spec(), pl.BlockSpec((8, 1), lambda i: (i, 0))))(x)


def _first_negative_row(x):
    neg = np.asarray(x[:, 0]) < 0
    i = int(np.argmax(neg)) if neg.any() else x.shape[0]
    return jnp.full((1, C), i, jnp.int32)


@case("control_flow/while_reads_ref", tags={"control_flow", "indexing"},
      inputs=lambda rng: (jnp.concatenate([jnp.abs(randn(rng, (11, C))) + 0.1,
                                           -jnp.ones((5, C))]),),
      reference=_first_negative_row)
def while_reads_ref(pallas_call, x):
    """A while_loop whose condition reads the ref at the carried index (a search)."""
    def kernel(x_ref, o_ref):
        def cond(i):
            return (i < 16) & (x_ref[jnp.minimum(i, 15), 0] >= 0)

        o_ref[...] = jnp.full((1, C), lax.while_loop(cond, lambda i: i + 1, jnp.int32(0)),
                              jnp.int32)

    return pallas_call(kernel, out_shape=sds((1, C), jnp.int32))(x)


@case("control_flow/fori_bound_from_memory", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)), jnp.asarray([0, 1, 3, 5], jnp.int32).reshape(4, 1, 1)),
      reference=lambda x, n: x * jnp.repeat(2.0 ** n[:, 0, 0].astype(jnp.float32), 8)[:, None])
def fori_bound_mem(pallas_call, x, n):
    """A fori_loop whose upper bound is read from an operand (per program)."""
    def kernel(x_ref, n_ref, o_ref):
        o_ref[...] = lax.fori_loop(0, n_ref[0, 0], lambda i, c: c * 2.0, x_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[_spec(), pl.BlockSpec((None, 1, 1), lambda i: (i, 0, 0))],
                       out_specs=_spec())(x, n)


@case("control_flow/nested_when", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: jnp.concatenate(
          [r + (1.0 if i >= 2 else 0.0) + (10.0 if i == 3 else 0.0)
           for i, r in enumerate(_rows(x))]))
def nested_when(pallas_call, x):
    """pl.when inside pl.when."""
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[...] = x_ref[...]

        @pl.when(i >= 2)
        def _():
            o_ref[...] += 1.0

            @pl.when(i == 3)
            def _():
                o_ref[...] += 10.0

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[_spec()], out_specs=_spec())(x)


@case("control_flow/switch_on_data", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)), jnp.asarray([2, 0, 7, 1], jnp.int32).reshape(4, 1, 1)),
      reference=lambda x, k: jnp.concatenate(
          [[r + 1, r * 2, -r][min(int(k[i, 0, 0]), 2)] for i, r in enumerate(_rows(x))]))
def switch_data(pallas_call, x, k):
    """lax.switch on an index read from memory (out-of-range indices clamp to the last
    branch)."""
    def kernel(x_ref, k_ref, o_ref):
        o_ref[...] = lax.switch(k_ref[0, 0], [lambda v: v + 1, lambda v: v * 2, lambda v: -v],
                                x_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[_spec(), pl.BlockSpec((None, 1, 1), lambda i: (i, 0, 0))],
                       out_specs=_spec())(x, k)


@case("control_flow/scan_reverse", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.cumsum(x[::-1], axis=0)[::-1],
      tolerance={"float32": (1e-5, 1e-5)})
def scan_reverse(pallas_call, x):
    """lax.scan(reverse=True): a suffix sum over the rows."""
    def kernel(x_ref, o_ref):
        def step(acc, row):
            acc = acc + row
            return acc, acc

        o_ref[...] = lax.scan(step, jnp.zeros((C,), jnp.float32), x_ref[...], reverse=True)[1]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("control_flow/fori_tuple_carry_offset", tags={"control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: (x * 3.0 ** 4, jnp.full((1, C), sum(range(3, 7)), jnp.int32)))
def fori_tuple(pallas_call, x):
    """fori_loop(3, 7) with an (array, int32 scalar) carry."""
    def kernel(x_ref, o_ref, n_ref):
        v, n = lax.fori_loop(3, 7, lambda i, c: (c[0] * 3.0, c[1] + i),
                             (x_ref[...], jnp.int32(0)))
        o_ref[...] = v
        n_ref[...] = jnp.full((1, C), n, jnp.int32)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds((1, C), jnp.int32)))(x)
