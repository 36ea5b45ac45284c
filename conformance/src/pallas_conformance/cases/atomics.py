"""Atomics (``pallas.atomics``): read-modify-write and compare-and-swap on output refs.

Outputs that atomics accumulate into start from an input through
``input_output_aliases``. Where grid programs contend for the same elements, the cases
check only order-independent results (sums of integer-valued numbers, max/min, bitwise
ops, counts), since on a GPU the programs run concurrently in an unspecified order. A
second output blocked by the program id keeps the programs parallel on backends that
would otherwise run a grid axis no output depends on as a loop.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas import atomics
from pallas_conformance.registry import case, randn, sds

C = 128
N = 4  # programs (blocks of 8 rows)
ALL = (slice(None), slice(None))


def _ints_as_f32(rng, shape, lo=-50, hi=50):
    """Integer-valued float32s, whose sums are exact in any order."""
    return jnp.asarray(rng.integers(lo, hi + 1, size=shape), jnp.float32)


def _block():
    return pl.BlockSpec((8, C), lambda i: (i, 0))


def _shared():
    return pl.BlockSpec((8, C), lambda i: (0, 0))


def _block_sum(x):
    return jnp.sum(x.reshape(-1, 8, C), axis=0)


def _returns_old(pallas_call, op, acc, x):
    """One program applies ``op(o_ref, ALL, x)`` to the aliased output ``acc`` and stores
    what it returns (the values held before) as the second output."""
    def kernel(acc_ref, x_ref, o_ref, old_ref):
        old_ref[...] = op(o_ref, ALL, x_ref[...])

    return pallas_call(kernel, out_shape=(sds(acc.shape, acc.dtype), sds(acc.shape, acc.dtype)),
                       input_output_aliases={0: 0})(acc, x)


@case("atomics/add_returns_old_f32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda acc, x: (acc + x, acc))
def add_returns_old(pallas_call, acc, x):
    """One program: atomic_add returns the values the ref held before the addition."""
    return _returns_old(pallas_call, atomics.atomic_add, acc, x)


@case("atomics/xchg_returns_old_i32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C), jnp.int32), randn(rng, (8, C), jnp.int32)),
      reference=lambda acc, x: (x, acc))
def xchg_returns_old(pallas_call, acc, x):
    """One program: atomic_xchg writes the new values and returns the old ones."""
    return _returns_old(pallas_call, atomics.atomic_xchg, acc, x)


@case("atomics/masked_add_f32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (16, C)), randn(rng, (8, C))),
      reference=lambda acc, x: (acc.at[8:].add(jnp.where(x > 0, x, 0.0)),
                                jnp.where(x > 0, acc[8:], 0.0)))
def masked_add(pallas_call, acc, x):
    """A masked atomic_add on a ``pl.ds`` view: masked-out elements are left untouched."""
    def kernel(acc_ref, x_ref, o_ref, old_ref):
        x = x_ref[...]
        old = atomics.atomic_add(o_ref, (pl.ds(8, 8), slice(None)), x, mask=x > 0)
        old_ref[...] = jnp.where(x > 0, old, 0.0)

    return pallas_call(kernel, out_shape=(sds(acc.shape, acc.dtype), sds(x.shape, x.dtype)),
                       input_output_aliases={0: 0})(acc, x)


@case("atomics/grid_sum_add_i32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (jnp.zeros((8, C), jnp.int32), randn(rng, (8 * N, C), jnp.int32)),
      reference=lambda z, x: (_block_sum(x), x * 2))
def grid_sum_i32(pallas_call, zeros, x):
    """Every program atomic_adds its block into the same output block (contention)."""
    def kernel(z_ref, x_ref, s_ref, y_ref):
        atomics.atomic_add(s_ref, ALL, x_ref[...])
        y_ref[...] = x_ref[...] * 2

    return pallas_call(kernel, out_shape=(sds((8, C), jnp.int32), sds(x.shape, x.dtype)),
                       grid=(N,), in_specs=[_shared(), _block()],
                       out_specs=(_shared(), _block()), input_output_aliases={0: 0})(zeros, x)


@case("atomics/masked_grid_sum_f32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (jnp.zeros((8, C), jnp.float32), _ints_as_f32(rng, (8 * N, C))),
      reference=lambda z, x: (_block_sum(jnp.where(x > 0, x, 0.0)), x + 1))
def masked_grid_sum(pallas_call, zeros, x):
    """Contended float32 atomic_add of the positive elements only (integer-valued, exact)."""
    def kernel(z_ref, x_ref, s_ref, y_ref):
        x = x_ref[...]
        atomics.atomic_add(s_ref, ALL, x, mask=x > 0)
        y_ref[...] = x + 1

    return pallas_call(kernel, out_shape=(sds((8, C), jnp.float32), sds(x.shape, x.dtype)),
                       grid=(N,), in_specs=[_shared(), _block()],
                       out_specs=(_shared(), _block()), input_output_aliases={0: 0})(zeros, x)


def _contended_max_min(pallas_call, lo, hi, x, y_of):
    """Every program atomic_max-es and atomic_min-es its block of ``x`` into two shared
    blocks (aliased to ``lo`` and ``hi``) and stores ``y_of(block)`` in a block of its
    own."""
    def kernel(lo_ref, hi_ref, x_ref, mx_ref, mn_ref, y_ref):
        atomics.atomic_max(mx_ref, ALL, x_ref[...])
        atomics.atomic_min(mn_ref, ALL, x_ref[...])
        y_ref[...] = y_of(x_ref[...])

    shared = sds((8, C), lo.dtype)
    return pallas_call(
        kernel, out_shape=(shared, shared, sds(x.shape, x.dtype)),
        grid=(N,), in_specs=[_shared(), _shared(), _block()],
        out_specs=(_shared(), _shared(), _block()),
        input_output_aliases={0: 0, 1: 1})(lo, hi, x)


@case("atomics/max_min_f32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (jnp.full((8, C), -jnp.inf, jnp.float32),
                          jnp.full((8, C), jnp.inf, jnp.float32), randn(rng, (8 * N, C))),
      reference=lambda lo, hi, x: (jnp.max(x.reshape(N, 8, C), axis=0),
                                   jnp.min(x.reshape(N, 8, C), axis=0), -x))
def max_min(pallas_call, lo, hi, x):
    """Contended atomic_max and atomic_min of every program's block into shared blocks."""
    return _contended_max_min(pallas_call, lo, hi, x, lambda v: -v)


@case("atomics/max_min_i32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C), jnp.int32), randn(rng, (8 * N, C), jnp.int32)),
      reference=lambda init, x: (
          jnp.maximum(init, jnp.max(x.reshape(N, 8, C), axis=0)),
          jnp.minimum(init, jnp.min(x.reshape(N, 8, C), axis=0)), x))
def max_min_i32(pallas_call, init, x):
    """Contended int32 atomic_max/atomic_min starting from the same nonzero values."""
    return _contended_max_min(pallas_call, init, init, x, lambda v: v)


def _bitwise_ref(a, o, x, init):
    blocks = x.reshape(N, 8, C)
    return (a & jnp.bitwise_and.reduce(blocks, axis=0), o | jnp.bitwise_or.reduce(blocks, axis=0),
            init ^ jnp.bitwise_xor.reduce(blocks, axis=0), x)


def _bits(rng, shape):
    return jnp.asarray(rng.integers(0, 2**31 - 1, size=shape), jnp.int32)


@case("atomics/bitwise_and_or_xor_i32", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (_bits(rng, (8, C)), _bits(rng, (8, C)), _bits(rng, (8 * N, C)),
                          _bits(rng, (8, C))),
      reference=lambda a, o, x, init: _bitwise_ref(a, o, x, init))
def bitwise(pallas_call, a, o, x, init):
    """Contended atomic_and, atomic_or and atomic_xor (order-independent, exact)."""
    def kernel(a_in, o_in, x_ref, init_ref, a_ref, o_ref, x_out, y_ref):
        x = x_ref[...]
        atomics.atomic_and(a_ref, ALL, x)
        atomics.atomic_or(o_ref, ALL, x)
        atomics.atomic_xor(x_out, ALL, x)
        y_ref[...] = x

    i32 = sds((8, C), jnp.int32)
    return pallas_call(
        kernel, out_shape=(i32, i32, i32, sds(x.shape, x.dtype)),
        grid=(N,), in_specs=[_shared(), _shared(), _block(), _shared()],
        out_specs=(_shared(), _shared(), _shared(), _block()),
        input_output_aliases={0: 0, 1: 1, 3: 2})(a, o, x, init)


def _tickets_ref(zeros, x):
    counter = zeros.at[0, 0].set(N).at[0, 1].set(N * (N - 1) // 2).at[0, 2].set(2**N - 1)
    return counter, x


@case("atomics/ticket_counter_returns_old", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (jnp.zeros((8, C), jnp.int32), randn(rng, (8 * N, C), jnp.int32)),
      reference=_tickets_ref)
def tickets(pallas_call, zeros, x):
    """Each program draws a ticket (the old value of a scalar atomic_add); every ticket
    0..N-1 is drawn exactly once, whatever the order: their sum and bit set prove it."""
    def kernel(z_ref, x_ref, c_ref, y_ref):
        t = atomics.atomic_add(c_ref, (0, 0), 1)
        atomics.atomic_add(c_ref, (0, 1), t)
        atomics.atomic_or(c_ref, (0, 2), jnp.left_shift(jnp.int32(1), t))
        y_ref[...] = x_ref[...]

    return pallas_call(kernel, out_shape=(sds((8, C), jnp.int32), sds(x.shape, x.dtype)),
                       grid=(N,), in_specs=[_shared(), _block()],
                       out_specs=(_shared(), _block()), input_output_aliases={0: 0})(zeros, x)


@case("atomics/cas_elementwise", tags={"atomics", "aliasing", "multiple_outputs"},
      inputs=lambda rng: (jnp.asarray(rng.integers(0, 3, size=(8, C)), jnp.int32),
                          randn(rng, (8, C), jnp.int32)),
      reference=lambda ref, val: (jnp.where(ref == 1, val, ref), ref))
def cas_elementwise(pallas_call, ref, val):
    """atomic_cas on a block: writes ``val`` where the ref equals ``cmp``; returns the old."""
    def kernel(r_ref, v_ref, o_ref, old_ref):
        old_ref[...] = atomics.atomic_cas(o_ref, 1, v_ref[...])

    return pallas_call(kernel, out_shape=(sds(ref.shape, ref.dtype), sds(ref.shape, ref.dtype)),
                       input_output_aliases={0: 0})(ref, val)


@case("atomics/cas_retry_loop", tags={"atomics", "aliasing", "multiple_outputs", "control_flow"},
      inputs=lambda rng: (jnp.ones((8, C), jnp.int32), randn(rng, (8 * N, C), jnp.int32)),
      reference=lambda one, x: (one.at[0, 0].set(3 * 5 * 7 * 9).at[0, 1].set(N + 1), x))
def cas_retry_loop(pallas_call, one, x):
    """A lock-free update no atomic instruction does: each program multiplies a shared
    element by its factor 2i+3 with an atomic_cas retry loop (the product is order-free)."""
    def kernel(o_in, x_ref, acc_ref, y_ref):
        factor = pl.program_id(0) * 2 + 3
        cell = acc_ref.at[0, 0]

        def retry(carry):
            guess, _ = carry
            seen = atomics.atomic_cas(cell, guess, guess * factor)
            return seen, seen != guess

        guess = atomics.atomic_add(acc_ref, (0, 0), 0)  # an atomic read
        lax.while_loop(lambda c: c[1], retry, (guess, True))
        atomics.atomic_add(acc_ref, (0, 1), 1)
        y_ref[...] = x_ref[...]

    return pallas_call(kernel, out_shape=(sds((8, C), jnp.int32), sds(x.shape, x.dtype)),
                       grid=(N,), in_specs=[_shared(), _block()],
                       out_specs=(_shared(), _block()), input_output_aliases={0: 0})(one, x)


def _histogram_ref(zeros, x):
    counts = jnp.zeros((C,), jnp.int32).at[x.reshape(-1)].add(1)
    return zeros.at[0].set(counts), x


@case("atomics/histogram", tags={"atomics", "aliasing", "multiple_outputs", "reductions",
                                      "control_flow"},
      inputs=lambda rng: (jnp.zeros((8, C), jnp.int32),
                          jnp.asarray(rng.integers(0, C, size=(8 * N, C)), jnp.int32)),
      reference=_histogram_ref)
def histogram(pallas_call, zeros, x):
    """A 128-bin histogram: each program counts its block per bin (a one-hot sum) and
    atomic_adds the counts into row 0 of a shared block."""
    def kernel(z_ref, x_ref, h_ref, y_ref):
        bins = lax.broadcasted_iota(jnp.int32, (C, C), 1)

        def row(r, counts):
            onehot = (x_ref[r, :][:, None] == bins).astype(jnp.int32)
            return counts + jnp.sum(onehot, axis=0)

        counts = lax.fori_loop(0, 8, row, jnp.zeros((C,), jnp.int32))
        atomics.atomic_add(h_ref, (0, slice(None)), counts)
        y_ref[...] = x_ref[...]

    return pallas_call(kernel, out_shape=(sds((8, C), jnp.int32), sds(x.shape, x.dtype)),
                       grid=(N,), in_specs=[_shared(), _block()],
                       out_specs=(_shared(), _block()), input_output_aliases={0: 0})(zeros, x)

