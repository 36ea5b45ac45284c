"""More control flow: cond with several operands and results, conds inside loops and
loops inside conds, while_loops whose trip counts differ per program or read refs,
fori_loops with bounds read from memory, nested pl.when, switch on data, reversed scan.

Blocks are (8, 128); gridded cases run (32, 128) arrays over four programs.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
from pallas_conformance.registry import case, randn, sds

C = 128


def _spec():
    return pl.BlockSpec((8, C), lambda i: (i, 0))


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
