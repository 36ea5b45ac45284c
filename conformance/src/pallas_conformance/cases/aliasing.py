"""input_output_aliases: outputs that start as their inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

R, C = 32, 128


@case("aliasing/in_place_update", tags={"aliasing"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x + 1)
def in_place(pallas_call, x):
    """o = x + 1 with the output aliased to the input."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       input_output_aliases={0: 0})(x)


@case("aliasing/partial_update", tags={"aliasing"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: x.at[8:16].set(0.0).at[24:32].set(0.0))
def partial_update(pallas_call, x):
    """Only blocks 1 and 3 are written; the others keep the aliased input's values."""
    def kernel(x_ref, o_ref):
        del x_ref
        o_ref[...] = jnp.zeros_like(o_ref)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec((8, C), lambda i: (2 * i + 1, 0)),
                       input_output_aliases={0: 0})(x)


@case("aliasing/second_input_to_first_output", tags={"aliasing", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda a, b: (a + b, a * 2))
def second_to_first(pallas_call, a, b):
    """input 1 aliased to output 0, and a second, unaliased output."""
    def kernel(a_ref, b_ref, o_ref, p_ref):
        o_ref[...] = a_ref[...] + b_ref[...]
        p_ref[...] = a_ref[...] * 2

    return pallas_call(kernel, out_shape=(sds(a.shape, a.dtype), sds(a.shape, a.dtype)),
                       input_output_aliases={1: 0})(a, b)


@case("aliasing/read_modify_write", tags={"aliasing"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda acc, x: acc * 0.9 + x)
def read_modify_write(pallas_call, acc, x):
    """The kernel reads the aliased output ref itself (it holds the input's values)."""
    def kernel(acc_ref, x_ref, o_ref):
        del acc_ref
        o_ref[...] = o_ref[...] * 0.9 + x_ref[...]

    return pallas_call(kernel, out_shape=sds(acc.shape, acc.dtype),
                       input_output_aliases={0: 0})(acc, x)


@case("aliasing/under_jit_with_donation", tags={"aliasing"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x * x)
def donated(pallas_call, x):
    """An aliased call inside a jitted function that donates its argument."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * x_ref[...]

    call = pallas_call(kernel, out_shape=sds(x.shape, x.dtype), input_output_aliases={0: 0})
    return jax.jit(call, donate_argnums=0)(x + 0)
