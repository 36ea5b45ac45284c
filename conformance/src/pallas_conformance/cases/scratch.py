"""Scratch buffers (``scratch_shapes`` with ``pl.ANY`` buffers, which persist across grid
iterations) of several dtypes and ranks, ``pl.run_scoped`` (nested too), and scratch a
kernel allocates with ``jax.empty_ref``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.cases import _programs as shared
from pallas_conformance.registry import case, randn, sds

R, C = 32, 128


@case("scratch/staging_buffer", tags={"scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x * 3 + 1)
def staging(pallas_call, x):
    """A scratch buffer used as a staging area within one program."""
    def kernel(x_ref, o_ref, s_ref):
        s_ref[...] = x_ref[...] * 3
        o_ref[...] = s_ref[...] + 1

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[pl.ANY((8, C), jnp.float32)])(x)


@case("scratch/persists_across_grid", tags={"scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: jnp.cumsum(x.reshape(4, 8, C), axis=0).reshape(R, C))
def persists(pallas_call, x):
    """A running sum over grid steps kept in scratch (scratch persists across programs)."""
    return shared.running_sum(pallas_call, x)


@case("scratch/int32_counter", tags={"scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (R, C), jnp.int32),),
      reference=lambda x: x + jnp.repeat(jnp.arange(1, 5, dtype=jnp.int32), 8)[:, None])
def counter(pallas_call, x):
    """An int32 scalar-like scratch counter incremented once per program."""
    def kernel(x_ref, o_ref, n_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            n_ref[0] = 0

        n_ref[0] += 1
        o_ref[...] = x_ref[...] + n_ref[0]

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,), in_specs=[spec],
                       out_specs=spec, scratch_shapes=[pl.ANY((1,), jnp.int32)])(x)


@case("scratch/several_buffers", tags={"scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: (jnp.max(x, axis=1, keepdims=True) + jnp.sum(x, axis=1, keepdims=True))
      * jnp.ones((1, C)))
def several(pallas_call, x):
    """Two scratch buffers of different shapes, given as a list."""
    def kernel(x_ref, o_ref, m_ref, s_ref):
        m_ref[...] = jnp.max(x_ref[...], axis=1, keepdims=True)
        s_ref[...] = jnp.sum(x_ref[...], axis=1, keepdims=True)
        o_ref[...] = jnp.broadcast_to(m_ref[...] + s_ref[...], (8, C))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[pl.ANY((8, 1), jnp.float32),
                                       pl.ANY((8, 1), jnp.float32)])(x)


@case("scratch/run_scoped", tags={"scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: jnp.tanh(x) * 2)
def run_scoped(pallas_call, x):
    """pl.run_scoped allocates a buffer for the body of a function."""
    def kernel(x_ref, o_ref):
        def body(tmp_ref):
            tmp_ref[...] = jnp.tanh(x_ref[...])
            o_ref[...] = tmp_ref[...] * 2

        pl.run_scoped(body, pl.ANY((8, C), jnp.float32))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("scratch/run_scoped_returns", tags={"scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: jnp.sum(x * x))
def run_scoped_returns(pallas_call, x):
    """pl.run_scoped returning a value computed from two scoped buffers."""
    def kernel(x_ref, o_ref):
        def body(a_ref, b_ref):
            a_ref[...] = x_ref[...]
            b_ref[...] = a_ref[...] * a_ref[...]
            return jnp.sum(b_ref[...])

        o_ref[0, 0] = pl.run_scoped(body, pl.ANY((8, C), jnp.float32),
                                    pl.ANY((8, C), jnp.float32))

    out = pallas_call(kernel, out_shape=sds((1, 1), x.dtype))(x)
    return out[0, 0]


@case("scratch/run_scoped_sequential_and_nested", tags={"scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x * 3 - (x + 1) + jnp.tanh(x) * 2)
def run_scoped_sequential(pallas_call, x):
    """Sequential and nested pl.run_scoped: a nested scope's buffer is live together with
    its parent's (a backend may not give them the same memory), a scope opened after its
    sibling closed may reuse the sibling's (and must still see only its own values)."""
    def kernel(x_ref, o_ref):
        def first(a_ref):
            a_ref[...] = x_ref[...] * 3

            def inner(b_ref):
                b_ref[...] = x_ref[...] + 1
                o_ref[...] = a_ref[...] - b_ref[...]

            pl.run_scoped(inner, pl.ANY((8, C), jnp.float32))

        pl.run_scoped(first, pl.ANY((8, C), jnp.float32))

        def second(c_ref):
            c_ref[...] = jnp.tanh(x_ref[...])
            o_ref[...] += c_ref[...] * 2

        pl.run_scoped(second, pl.ANY((8, C), jnp.float32))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("scratch/bf16_buffer", tags={"scratch", "bf16"},
      inputs=lambda rng: (randn(rng, (8, C), jnp.bfloat16),), reference=lambda x: x * 2)
def bf16_scratch(pallas_call, x):
    """A bf16 scratch buffer."""
    def kernel(x_ref, o_ref, s_ref):
        s_ref[...] = x_ref[...]
        o_ref[...] = s_ref[...] * 2

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[pl.ANY((8, C), jnp.bfloat16)])(x)


@case("scratch/several_dtypes", tags={"scratch", "int8", "bool"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: jnp.where(x > 0, (x * 10).astype(jnp.int8).astype(jnp.int32), -1))
def several_dtypes(pallas_call, x):
    """int8, bool and int32 scratch buffers in one kernel."""
    def kernel(x_ref, o_ref, q_ref, m_ref, i_ref):
        q_ref[...] = (x_ref[...] * 10).astype(jnp.int8)
        m_ref[...] = x_ref[...] > 0
        i_ref[...] = q_ref[...].astype(jnp.int32)
        o_ref[...] = jnp.where(m_ref[...], i_ref[...], -1)

    return pallas_call(kernel, out_shape=sds(x.shape, jnp.int32),
                       scratch_shapes=[pl.ANY((8, C), jnp.int8), pl.ANY((8, C), jnp.bool_),
                                       pl.ANY((8, C), jnp.int32)])(x)


@case("scratch/nested_run_scoped", tags={"scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: (x * 2 + 1) * 3)
def nested_scoped(pallas_call, x):
    """pl.run_scoped inside pl.run_scoped: the inner buffer sees the outer one."""
    def kernel(x_ref, o_ref):
        def outer(a_ref):
            a_ref[...] = x_ref[...] * 2

            def inner(b_ref):
                b_ref[...] = a_ref[...] + 1
                o_ref[...] = b_ref[...] * 3

            pl.run_scoped(inner, pl.ANY((8, C), jnp.float32))

        pl.run_scoped(outer, pl.ANY((8, C), jnp.float32))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)


@case("scratch/three_d_buffer", tags={"scratch", "control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)),),
      reference=lambda x: x * (1 + 2 + 4 + 8))
def three_d_scratch(pallas_call, x):
    """A (4, 8, 128) scratch buffer filled and summed slot by slot in a loop."""
    def kernel(x_ref, o_ref, s_ref):
        for k in range(4):
            s_ref[k] = x_ref[...] * float(2 ** k)
        o_ref[...] = jax.lax.fori_loop(0, 4, lambda k, acc: acc + s_ref[k],
                                       jnp.zeros((8, C), jnp.float32))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[pl.ANY((4, 8, C), jnp.float32)])(x)


@case("scratch/jax_empty_ref", tags={"scratch", "empty_ref"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: (x + 1) * 4)
def jax_empty_ref(pallas_call, x):
    """A scratch buffer the kernel allocates itself with jax.empty_ref, written then read."""
    def kernel(x_ref, o_ref):
        s_ref = jax.empty_ref(jax.ShapeDtypeStruct(x_ref.shape, x_ref.dtype))
        s_ref[...] = x_ref[...] + 1
        o_ref[...] = s_ref[...] * 4

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)
