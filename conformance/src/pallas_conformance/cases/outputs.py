"""Multiple outputs (of different dtypes, with different grids of blocks) and pytrees of
operands, outputs and specs (namedtuples, lists, None leaves and None operands)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

R, C = 16, 128


def _spec():
    return pl.BlockSpec((8, C), lambda i: (i, 0))


@case("multiple_outputs/two_dtypes", tags={"multiple_outputs"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: (x * 2, (x > 0).astype(jnp.int32)))
def two_dtypes(pallas_call, x):
    """Two outputs of different dtypes from one kernel."""
    def kernel(x_ref, a_ref, b_ref):
        a_ref[...] = x_ref[...] * 2
        b_ref[...] = (x_ref[...] > 0).astype(jnp.int32)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds(x.shape, jnp.int32)),
                       grid=(2,), in_specs=[_spec()], out_specs=(_spec(), _spec()))(x)


@case("multiple_outputs/three_shapes", tags={"multiple_outputs", "reductions"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: (jnp.max(x, axis=1), jnp.min(x, axis=0), x.T))  # a list comes back a tuple
def three_shapes(pallas_call, x):
    """Three outputs of different shapes (the kernel sees whole arrays)."""
    def kernel(x_ref, mx_ref, mn_ref, t_ref):
        mx_ref[...] = jnp.max(x_ref[...], axis=1)
        mn_ref[...] = jnp.min(x_ref[...], axis=0)
        t_ref[...] = x_ref[...].T

    return pallas_call(kernel, out_shape=[sds((R,), x.dtype), sds((C,), x.dtype),
                                          sds((C, R), x.dtype)])(x)


@case("multiple_outputs/different_block_specs", tags={"multiple_outputs"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: (x + 1, jnp.sum(x.reshape(2, 8, C), axis=1, keepdims=True)))
def different_specs(pallas_call, x):
    """One output tiled like the input, one with a (squeezed) block per program: a
    (2, 1, C) array whose (1, C) blocks are whole in their last two dims."""
    def kernel(x_ref, y_ref, s_ref):
        y_ref[...] = x_ref[...] + 1
        s_ref[...] = jnp.sum(x_ref[...], axis=0, keepdims=True)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds((2, 1, C), x.dtype)),
                       grid=(2,), in_specs=[_spec()],
                       out_specs=(_spec(), pl.BlockSpec((None, 1, C), lambda i: (i, 0, 0))))(x)


@case("pytrees/dict_operands", tags={"pytrees"},
      inputs=lambda rng: ({"w": randn(rng, (8, C)), "b": randn(rng, (8, C))},
                          randn(rng, (8, C))),
      reference=lambda p, x: x * p["w"] + p["b"])
def dict_operands(pallas_call, params, x):
    """A dict of operands: the kernel receives a dict of refs."""
    def kernel(p_refs, x_ref, o_ref):
        o_ref[...] = x_ref[...] * p_refs["w"][...] + p_refs["b"][...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(params, x)


@case("pytrees/dict_outputs", tags={"pytrees", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (R, C)),),
      reference=lambda x: {"pos": jnp.maximum(x, 0), "neg": jnp.minimum(x, 0)})
def dict_outputs(pallas_call, x):
    """A dict out_shape with a matching dict of out_specs."""
    def kernel(x_ref, o_refs):
        o_refs["pos"][...] = jnp.maximum(x_ref[...], 0)
        o_refs["neg"][...] = jnp.minimum(x_ref[...], 0)

    return pallas_call(kernel, out_shape={"pos": sds(x.shape, x.dtype),
                                          "neg": sds(x.shape, x.dtype)},
                       grid=(2,), in_specs=[_spec()],
                       out_specs={"pos": _spec(), "neg": _spec()})(x)


@case("pytrees/nested_tuple_specs", tags={"pytrees"},
      inputs=lambda rng: ((randn(rng, (R, C)), (randn(rng, (R, C)), randn(rng, (1, C)))),),
      reference=lambda t: t[0] * t[1][0] + t[1][1])
def nested(pallas_call, tree):
    """Nested tuples of operands with a matching nested tuple of in_specs."""
    def kernel(t_refs, o_ref):
        a_ref, (b_ref, c_ref) = t_refs
        o_ref[...] = a_ref[...] * b_ref[...] + c_ref[...]

    a = tree[0]
    return pallas_call(
        kernel, out_shape=sds(a.shape, a.dtype), grid=(2,),
        in_specs=[(_spec(), (_spec(), pl.BlockSpec((1, C), lambda i: (0, 0))))],
        out_specs=_spec())(tree)


@case("pytrees/list_scratch", tags={"pytrees", "scratch"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x * 4)
def list_scratch(pallas_call, x):
    """Scratch shapes given as a nested pytree."""
    def kernel(x_ref, o_ref, scratch):
        a_ref, (b_ref,) = scratch
        a_ref[...] = x_ref[...] * 2
        b_ref[...] = a_ref[...] * 2
        o_ref[...] = b_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       scratch_shapes=[[pl.ANY((8, C), jnp.float32),
                                        (pl.ANY((8, C), jnp.float32),)]])(x)


# --- Multiple outputs -------------------------------------------------------------------

@case("multiple_outputs/accumulator_and_tiles",
      tags={"multiple_outputs", "reductions", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: (jnp.tanh(x), jnp.sum(x.reshape(4, 8, C), axis=0)),
      tolerance={"float32": (1e-5, 1e-5)})
def acc_and_tiles(pallas_call, x):
    """One output written per block, another revisited by every program (accumulated)."""
    def kernel(x_ref, t_ref, s_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            s_ref[...] = jnp.zeros_like(s_ref)

        t_ref[...] = jnp.tanh(x_ref[...])
        s_ref[...] += x_ref[...]

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds((8, C), x.dtype)),
                       grid=(4,), in_specs=[_spec()],
                       out_specs=(_spec(), pl.BlockSpec((8, C), lambda i: (0, 0))))(x)


@case("multiple_outputs/four_dtypes", tags={"multiple_outputs", "bool", "int8", "bf16"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: (x > 0, (x * 10).astype(jnp.int8), x.astype(jnp.bfloat16),
                           jnp.abs(x)))
def four_dtypes(pallas_call, x):
    """Four outputs of four dtypes (bool, int8, bf16, f32) from one kernel."""
    def kernel(x_ref, b_ref, i_ref, h_ref, f_ref):
        v = x_ref[...]
        b_ref[...] = v > 0
        i_ref[...] = (v * 10).astype(jnp.int8)
        h_ref[...] = v.astype(jnp.bfloat16)
        f_ref[...] = jnp.abs(v)

    shapes = tuple(sds(x.shape, d) for d in (jnp.bool_, jnp.int8, jnp.bfloat16, jnp.float32))
    return pallas_call(kernel, out_shape=shapes, grid=(2,), in_specs=[_spec()],
                       out_specs=(_spec(),) * 4)(x)


# --- Pytrees ----------------------------------------------------------------------------

class _Params(NamedTuple):
    scale: object
    shift: object


@case("pytrees/namedtuple_operands", tags={"pytrees"},
      inputs=lambda rng: (randn(rng, (16, C)), randn(rng, (1, C)), randn(rng, (1, C))),
      reference=lambda x, s, b: x * s + b)
def namedtuple_ops(pallas_call, x, s, b):
    """A NamedTuple of operands with a NamedTuple of in_specs."""
    def kernel(x_ref, p, o_ref):
        o_ref[...] = x_ref[...] * p.scale[...] + p.shift[...]

    row = pl.BlockSpec((1, C), lambda i: (0, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec(), _Params(row, row)],
                       out_specs=_spec())(x, _Params(s, b))


@case("pytrees/list_outputs_mixed_specs", tags={"pytrees", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: (x + 1, [x * 2, x.reshape(2, 8, C).max(axis=1, keepdims=True)]))
def list_outputs(pallas_call, x):
    """A nested list out_shape whose leaves have different block specs (the kernel gets
    one argument per top-level entry: a ref and a list of refs)."""
    def kernel(x_ref, a_ref, bm_refs):
        b_ref, m_ref = bm_refs
        a_ref[...] = x_ref[...] + 1
        b_ref[...] = x_ref[...] * 2
        m_ref[...] = jnp.max(x_ref[...], axis=0, keepdims=True)

    return pallas_call(
        kernel, out_shape=[sds(x.shape, x.dtype), [sds(x.shape, x.dtype), sds((2, 1, C), x.dtype)]],
        grid=(2,), in_specs=[_spec()],
        out_specs=[_spec(), [_spec(), pl.BlockSpec((None, 1, C), lambda i: (i, 0, 0))]])(x)


@case("pytrees/absent_operand_none", tags={"pytrees"},
      inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: x * 3)
def absent_operand(pallas_call, x):
    """An operand passed as None (upstream's Hopper matmul passes ``c=None``) with the
    spec None: no operand, and the kernel gets None in its place."""
    def kernel(x_ref, c_ref, o_ref):
        assert c_ref is None
        o_ref[...] = x_ref[...] * 3

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2,),
                       in_specs=[_spec(), None], out_specs=_spec())(x, None)
