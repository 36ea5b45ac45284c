"""More operand plumbing: aliasing over a grid and with scalar prefetch, several aliased
pairs, outputs with different grids of blocks, pytrees with None (and None operands) and namedtuples, scalar
prefetch driving a 2-D grid and the output, scratch of several dtypes and nested
run_scoped."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

import pallas as pl
from pallas_conformance.registry import case, randn, sds

C = 128


def _spec():
    return pl.BlockSpec((8, C), lambda i: (i, 0))


# --- Aliasing -------------------------------------------------------------------------

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


# --- Scalar prefetch --------------------------------------------------------------------

def _block_sparse_ref(bcols, a, b):
    """Row block i of the output: a's block (i, k) times b's block (bcols[i, k], 0),
    summed over k."""
    out = []
    for i in range(2):
        acc = jnp.zeros((8, C), jnp.float32)
        for k in range(2):
            j = int(bcols[i, k])
            acc = acc + jnp.dot(a[i * 8:(i + 1) * 8, k * C:(k + 1) * C],
                                b[j * C:(j + 1) * C], precision="highest")
        out.append(acc)
    return jnp.concatenate(out)


@case("scalar_prefetch/block_sparse_matmul_2d_grid",
      tags={"scalar_prefetch", "dot", "sequential_grid"},
      inputs=lambda rng: (jnp.asarray([[2, 0], [1, 3]], jnp.int32),
                          randn(rng, (16, 2 * C), scale=0.3), randn(rng, (4 * C, C), scale=0.3)),
      reference=_block_sparse_ref, tolerance={"float32": (1e-4, 1e-4)})
def block_sparse_matmul(pallas_call, bcols, a, b):
    """A 2-D grid whose rhs index map reads a 2-D prefetched table (block-sparse matmul)."""
    def kernel(t_ref, a_ref, b_ref, o_ref):
        del t_ref

        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision="highest")

    return pallas_call(
        kernel, out_shape=sds((16, C), a.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(2, 2),
            in_specs=[pl.BlockSpec((8, C), lambda i, k, t: (i, k)),
                      pl.BlockSpec((C, C), lambda i, k, t: (t[i, k], 0))],
            out_specs=pl.BlockSpec((8, C), lambda i, k, t: (i, 0))))(bcols, a, b)


@case("scalar_prefetch/with_scratch", tags={"scalar_prefetch", "scratch"},
      inputs=lambda rng: (jnp.asarray([2, 5, 1, 3], jnp.int32), randn(rng, (32, C))),
      reference=lambda n, x: x * jnp.repeat(n, 8)[:, None].astype(jnp.float32) + 1)
def prefetch_scratch(pallas_call, n, x):
    """A prefetched scalar and a scratch buffer in the same kernel (ref order: prefetch,
    inputs, outputs, scratch)."""
    def kernel(n_ref, x_ref, o_ref, s_ref):
        s_ref[...] = x_ref[...] * n_ref[pl.program_id(0)].astype(jnp.float32)
        o_ref[...] = s_ref[...] + 1

    spec = pl.BlockSpec((8, C), lambda i, n: (i, 0))
    return pallas_call(
        kernel, out_shape=sds(x.shape, x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(4,),
                                            in_specs=[spec], out_specs=spec,
                                            scratch_shapes=[pl.ANY((8, C), jnp.float32)]))(n, x)


# --- Scratch ----------------------------------------------------------------------------

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


# --- Sub-byte operands ------------------------------------------------------------------

@case("operands/int4_select_and_widen", tags={"elementwise", "int4"},
      inputs=lambda rng: (randn(rng, (16, C), jnp.bool_), randn(rng, (16, C), jnp.int4),
                          randn(rng, (16, C), jnp.uint4)),
      reference=lambda m, x, u: (jnp.where(m, x, 0), x.astype(jnp.int32),
                                 u.astype(jnp.int32)))
def int4_select_and_widen(pallas_call, m, x, u):
    """int4/uint4 blocks selected under a mask and widened to int32 (sign- and
    zero-extended): what TPUs do with 4-bit integers (no arithmetic in int4)."""
    def kernel(m_ref, x_ref, u_ref, o_ref, w_ref, v_ref):
        o_ref[...] = jnp.where(m_ref[...], x_ref[...], 0)
        w_ref[...] = x_ref[...].astype(jnp.int32)
        v_ref[...] = u_ref[...].astype(jnp.int32)

    return pallas_call(kernel, out_shape=(sds(x.shape, x.dtype), sds(x.shape, jnp.int32),
                                          sds(u.shape, jnp.int32)))(m, x, u)


@case("scratch/jax_empty_ref", tags={"scratch", "empty_ref"},
      inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: (x + 1) * 4)
def jax_empty_ref(pallas_call, x):
    """A scratch buffer the kernel allocates itself with jax.empty_ref, written then read."""
    def kernel(x_ref, o_ref):
        s_ref = jax.empty_ref(jax.ShapeDtypeStruct(x_ref.shape, x_ref.dtype))
        s_ref[...] = x_ref[...] + 1
        o_ref[...] = s_ref[...] * 4

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)
