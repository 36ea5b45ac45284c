"""input_output_aliases: outputs that start as their inputs (in place, partly written,
read back, under jit with donation, tiled over a grid, two crossed pairs, and with
scalar prefetch, whose operand the alias index counts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

R, C = 32, 128


def _spec():
    return pl.BlockSpec((8, C), lambda i: (i, 0))


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


@case("aliasing/tiled_in_place", tags={"aliasing"},
      inputs=lambda rng: (randn(rng, (32, C)),), reference=lambda x: x * 2 + 1)
def tiled_in_place(pallas_call, x):
    """An aliased input and output tiled over a grid of four blocks."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2 + 1

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(4,),
                       in_specs=[_spec()], out_specs=_spec(),
                       input_output_aliases={0: 0})(x)


@case("aliasing/two_pairs_swapped", tags={"aliasing", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (16, C)), randn(rng, (16, C), jnp.int32)),
      reference=lambda a, b: (b + 1, a * 3))
def two_pairs(pallas_call, a, b):
    """Two aliased pairs of different dtypes, crossed: input 1 -> output 0, 0 -> 1."""
    def kernel(a_ref, b_ref, o_ref, p_ref):
        o_ref[...] = b_ref[...] + 1
        p_ref[...] = a_ref[...] * 3

    return pallas_call(kernel, out_shape=(sds(b.shape, b.dtype), sds(a.shape, a.dtype)),
                       grid=(2,), in_specs=[_spec(), _spec()], out_specs=(_spec(), _spec()),
                       input_output_aliases={1: 0, 0: 1})(a, b)


@case("aliasing/with_scalar_prefetch", tags={"aliasing", "scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([3, 1], jnp.int32), randn(rng, (32, C))),
      reference=lambda idx, x: x.at[24:32].multiply(-1).at[8:16].multiply(-1))
def alias_prefetch(pallas_call, idx, x):
    """Aliasing with scalar prefetch (the alias index counts the prefetch operand):
    only the blocks that the prefetched indices name are rewritten."""
    def kernel(idx_ref, x_ref, o_ref):
        del idx_ref
        o_ref[...] = -x_ref[...]

    spec = pl.BlockSpec((8, C), lambda i, idx: (idx[i], 0))
    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(2,),
                                            in_specs=[spec], out_specs=spec),
        input_output_aliases={1: 0})(idx, x)


@case("aliasing/closed_over_ref", tags={"aliasing", "closed_over_refs"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: (x, x * 3.0 + 1.0))
def closed_over_ref(pallas_call, x):
    """A kernel closing over Refs of an enclosing ``pl.run_state``: they are passed whole
    and updated in place, each grid step reading and writing its own rows of them."""
    def stateful(refs):
        x_ref, y_ref = refs

        def kernel(o_ref):
            rows = pl.ds(pl.program_id(0) * 8, 8)
            y_ref[rows, :] = x_ref[rows, :] * 2.0
            o_ref[...] = x_ref[rows, :] + 1.0

        out = pallas_call(kernel, grid=(R // 8,), out_specs=_spec(),
                          out_shape=sds(x.shape, x.dtype))()
        y_ref[...] += out

    return jax.jit(pl.run_state(stateful))((x, jnp.zeros_like(x)))
