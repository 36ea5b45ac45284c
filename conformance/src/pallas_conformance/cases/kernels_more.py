"""More whole kernels: a fused MLP block, an int8 matmul with per-row and per-column
scales, softmax over lane blocks with an online (running max/sum) pass, and RMS norm in
bf16. Small, (8, 128)-tiled shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_conformance.registry import case, randn, sds

C = 128
HI = lax.Precision.HIGHEST
F32, BF16 = jnp.float32, jnp.bfloat16


def _mlp_ref(x, w1, b1, w2):
    h = jax.nn.gelu(jnp.dot(x, w1, preferred_element_type=F32) + b1, approximate=True)
    return jnp.dot(h.astype(BF16), w2, preferred_element_type=F32).astype(BF16)


@case("kernels/fused_mlp_bf16", tags={"kernels", "dot", "bf16", "broadcasting", "elementwise"},
      inputs=lambda rng: (randn(rng, (32, C), BF16), randn(rng, (C, 2 * C), BF16, 0.1),
                          randn(rng, (1, 2 * C), F32, 0.1), randn(rng, (2 * C, C), BF16, 0.1)),
      reference=_mlp_ref, tolerance={"bfloat16": (3e-2, 3e-2)})
def fused_mlp(pallas_call, x, w1, b1, w2):
    """x @ w1 + b, gelu, @ w2 per row block: two bf16 dots with f32 accumulation."""
    def kernel(x_ref, w1_ref, b1_ref, w2_ref, o_ref):
        o_ref[...] = _mlp_ref(x_ref[...], w1_ref[...], b1_ref[...], w2_ref[...])

    whole = lambda shape: pl.BlockSpec(shape, lambda i: (0, 0))  # noqa: E731
    return pallas_call(kernel, out_shape=sds(x.shape, BF16), grid=(4,),
                       in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0)), whole(w1.shape),
                                 whole(b1.shape), whole(w2.shape)],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x, w1, b1, w2)


def _qmm_ref(a, b, sa, sb):
    return jnp.dot(a, b, preferred_element_type=jnp.int32).astype(F32) * sa * sb


@case("kernels/int8_matmul_scaled", tags={"kernels", "dot", "int8", "broadcasting"},
      inputs=lambda rng: (randn(rng, (16, 2 * C), jnp.int8), randn(rng, (2 * C, C), jnp.int8),
                          jnp.abs(randn(rng, (16, 1), scale=0.01)),
                          jnp.abs(randn(rng, (1, C), scale=0.01))),
      reference=_qmm_ref, tolerance={"float32": (1e-4, 1e-5)})
def int8_matmul(pallas_call, a, b, sa, sb):
    """A quantised matmul: int8 x int8 -> int32, dequantised by row and column scales."""
    def kernel(a_ref, b_ref, sa_ref, sb_ref, o_ref):
        o_ref[...] = _qmm_ref(a_ref[...], b_ref[...], sa_ref[...], sb_ref[...])

    return pallas_call(kernel, out_shape=sds((16, C), F32), grid=(2,),
                       in_specs=[pl.BlockSpec((8, 2 * C), lambda i: (i, 0)),
                                 pl.BlockSpec((2 * C, C), lambda i: (0, 0)),
                                 pl.BlockSpec((8, 1), lambda i: (i, 0)),
                                 pl.BlockSpec((1, C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(a, b, sa, sb)


NB = 4  # lane blocks per row


@case("kernels/online_softmax_lane_blocks",
      tags={"kernels", "reductions", "broadcasting", "scratch", "sequential_grid",
            "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (16, NB * C), scale=3.0),),
      reference=lambda x: jax.nn.softmax(x, axis=-1), tolerance={"float32": (1e-6, 1e-5)})
def online_softmax(pallas_call, x):
    """Softmax over rows wider than a block: a first sweep over the lane blocks keeps a
    running max and rescaled sum in scratch, a second sweep normalises."""
    def kernel(x_ref, o_ref, m_ref, l_ref):
        p, j = pl.program_id(1), pl.program_id(2)
        v = x_ref[...]

        @pl.when((p == 0) & (j == 0))
        def _():
            m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
            l_ref[...] = jnp.zeros_like(l_ref)

        @pl.when(p == 0)
        def _():
            m_new = jnp.maximum(m_ref[...], jnp.max(v, axis=-1, keepdims=True))
            l_ref[...] = (l_ref[...] * jnp.exp(m_ref[...] - m_new)
                          + jnp.sum(jnp.exp(v - m_new), axis=-1, keepdims=True))
            m_ref[...] = m_new

        @pl.when(p == 1)
        def _():
            o_ref[...] = jnp.exp(v - m_ref[...]) / l_ref[...]

    # The output index map keeps block (i, 0) during the first sweep, which writes
    # nothing to it; the second sweep writes every block before it is left.
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(2, 2, NB),
                       in_specs=[pl.BlockSpec((8, C), lambda i, p, j: (i, j))],
                       out_specs=pl.BlockSpec((8, C), lambda i, p, j: (i, j * p)),
                       scratch_shapes=[pl.ANY((8, 1), F32), pl.ANY((8, 1), F32)])(x)


def _rms_ref(x, w):
    xf = x.astype(F32)
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)
    return (y * w.astype(F32)).astype(BF16)


@case("kernels/rms_norm_bf16", tags={"kernels", "reductions", "broadcasting", "bf16"},
      inputs=lambda rng: (randn(rng, (32, 2 * C), BF16), randn(rng, (1, 2 * C), BF16)),
      reference=_rms_ref, tolerance={"bfloat16": (2e-2, 2e-2)})
def rms_norm_bf16(pallas_call, x, w):
    """RMS norm of bf16 rows computed in f32, scaled by a bf16 weight row."""
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = _rms_ref(x_ref[...], w_ref[...])

    return pallas_call(kernel, out_shape=sds(x.shape, BF16), grid=(4,),
                       in_specs=[pl.BlockSpec((8, 2 * C), lambda i: (i, 0)),
                                 pl.BlockSpec((1, 2 * C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, 2 * C), lambda i: (i, 0)))(x, w)
