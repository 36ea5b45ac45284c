"""Whole kernels: tiled matmul, an int8 matmul with per-row and per-column scales, a fused
MLP block, softmax (with an online running max/sum pass over lane blocks), layer norm,
RMS norm (f32 and bf16), causal flash attention (forward and backward) and paged
attention. Small, (8, 128)-tiled shapes, real structure."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_conformance import bench_kernels
from pallas_conformance.registry import case, randn, sds

HI = lax.Precision.HIGHEST
F32 = jnp.float32


# --- Tiled matmul -------------------------------------------------------------------

# The bf16 matmul cases (a grid of tiles, a K loop in the kernel) share their operands
# and reference: bf16 (64, 256) @ (256, 256), accumulated in f32, rounded to bf16.


def _bf16_matmul_inputs(rng):
    return (randn(rng, (64, 256), jnp.bfloat16), randn(rng, (256, 256), jnp.bfloat16))


def _bf16_matmul_reference(a, b):
    return jnp.dot(a, b, preferred_element_type=F32).astype(jnp.bfloat16)


_BF16_MATMUL_TOL = {"bfloat16": (3e-2, 2e-2)}


@case("kernels/tiled_matmul_f32", tags={"kernels", "dot", "scratch", "sequential_grid"},
      inputs=lambda rng: (randn(rng, (64, 384)), randn(rng, (384, 256))),
      reference=lambda a, b: jnp.dot(a, b, precision=HI),
      tolerance={"float32": (1e-4, 1e-4)})
def tiled_matmul(pallas_call, a, b):
    """A (2, 2, 3) grid of 32x128x128 tiles with an f32 scratch accumulator."""
    return bench_kernels.matmul(pallas_call, a, b, bm=32, bn=128, bk=128, out_dtype=F32,
                                precision=HI)


@case("kernels/tiled_matmul_bf16",
      tags={"kernels", "dot", "scratch", "sequential_grid", "bf16"},
      inputs=_bf16_matmul_inputs, reference=_bf16_matmul_reference,
      tolerance=_BF16_MATMUL_TOL)
def tiled_matmul_bf16(pallas_call, a, b):
    """bf16 operands, f32 accumulation, bf16 output."""
    return bench_kernels.matmul(pallas_call, a, b, bm=32, bn=128, bk=128,
                                out_dtype=jnp.bfloat16, precision=HI)


# --- Softmax, layer norm, RMS norm --------------------------------------------------

def _rowwise(pallas_call, body, x, *params, block_rows=8):
    rows, cols = x.shape

    def kernel(x_ref, *refs):
        *p_refs, o_ref = refs
        o_ref[...] = body(x_ref[...], *(r[...] for r in p_refs))

    row = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    vec = pl.BlockSpec((cols,), lambda i: (0,))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(rows // block_rows,),
                       in_specs=[row] + [vec] * len(params), out_specs=row)(x, *params)


def _softmax(x):
    x = x.astype(F32)
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=-1, keepdims=True)


@case("kernels/softmax_f32", tags={"kernels", "reductions", "broadcasting"},
      inputs=lambda rng: (randn(rng, (32, 256), scale=4.0),),
      reference=lambda x: jax.nn.softmax(x, axis=-1))
def softmax(pallas_call, x):
    """Row softmax, 8 rows per program."""
    return _rowwise(pallas_call, _softmax, x)


@case("kernels/softmax_bf16", tags={"kernels", "reductions", "broadcasting", "bf16"},
      inputs=lambda rng: (randn(rng, (32, 256), jnp.bfloat16, scale=4.0),),
      reference=lambda x: jax.nn.softmax(x.astype(F32), axis=-1).astype(jnp.bfloat16),
      tolerance={"bfloat16": (1e-2, 2e-2)})
def softmax_bf16(pallas_call, x):
    """bf16 softmax computed in f32."""
    return _rowwise(pallas_call, lambda v: _softmax(v).astype(jnp.bfloat16), x)


def _layer_norm(x, g, b, eps=1e-5):
    x = x.astype(F32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * g + b


@case("kernels/layer_norm_f32", tags={"kernels", "reductions", "broadcasting"},
      inputs=lambda rng: (randn(rng, (32, 256), scale=2.0) + 1.0, randn(rng, (256,)),
                          randn(rng, (256,))),
      reference=lambda x, g, b: _layer_norm(x, g, b), tolerance={"float32": (1e-4, 1e-4)})
def layer_norm(pallas_call, x, g, b):
    """Layer norm with scale and bias, 8 rows per program."""
    return _rowwise(pallas_call, _layer_norm, x, g, b)


def _rms_norm(x, g, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * g


@case("kernels/rms_norm_f32", tags={"kernels", "reductions", "broadcasting"},
      inputs=lambda rng: (randn(rng, (32, 256)), randn(rng, (256,))),
      reference=lambda x, g: _rms_norm(x, g), tolerance={"float32": (1e-4, 1e-4)})
def rms_norm(pallas_call, x, g):
    """RMS norm."""
    return _rowwise(pallas_call, _rms_norm, x, g)


# --- Causal flash attention -----------------------------------------------------------

BH, S, D = 2, 256, 32  # (batch * heads), sequence, head dim
BQ = BK = 128  # (8, 128)-aligned blocks; lse and delta are (BH, 1, S) arrays of (1, BQ) blocks


def _attention_reference(q, k, v):
    s = jnp.einsum("hqd,hkd->hqk", q, k, precision=HI) / math.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    s = jnp.where(mask, s, -jnp.inf)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v, precision=HI)


def _qkv(rng):
    return tuple(randn(rng, (BH, S, D)) for _ in range(3))


def _online_softmax_step(q_blk, k_ref, v_ref, qi, masked):
    """The loop body of a causal flash-attention forward over key blocks (online
    softmax; masked scores are ``masked``) and its initial carry."""
    def body(j, carry):
        m, l, acc = carry
        kb = k_ref[pl.ds(j * BK, BK), :]
        vb = v_ref[pl.ds(j * BK, BK), :]
        s = jnp.dot(q_blk, kb.T, precision=HI)
        rows = qi * BQ + lax.broadcasted_iota(jnp.int32, (BQ, BK), 0)
        cols = j * BK + lax.broadcasted_iota(jnp.int32, (BQ, BK), 1)
        s = jnp.where(cols <= rows, s, masked)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(s - m_new[:, None])
        alpha = jnp.exp(m - m_new)
        l_new = alpha * l + jnp.sum(p, axis=1)
        return m_new, l_new, acc * alpha[:, None] + jnp.dot(p, vb, precision=HI)

    init = (jnp.full((BQ,), masked, F32), jnp.zeros((BQ,), F32), jnp.zeros((BQ, D), F32))
    return body, init


def _flash_fwd(pallas_call, q, k, v):
    """Returns (o, lse)."""
    scale = 1.0 / math.sqrt(D)

    def kernel(q_ref, k_ref, v_ref, o_ref, lse_ref):
        qi = pl.program_id(1)
        body, init = _online_softmax_step(q_ref[...] * scale, k_ref, v_ref, qi, -jnp.inf)
        m, l, acc = lax.fori_loop(0, qi + 1, body, init)  # causal: only blocks <= qi
        o_ref[...] = acc / l[:, None]
        lse_ref[...] = (m + jnp.log(l))[None, :]

    q_spec = pl.BlockSpec((None, BQ, D), lambda h, i: (h, i, 0))
    kv_spec = pl.BlockSpec((None, S, D), lambda h, i: (h, 0, 0))
    return pallas_call(
        kernel, out_shape=(sds(q.shape, q.dtype), sds((BH, 1, S), F32)), grid=(BH, S // BQ),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=(q_spec, pl.BlockSpec((None, 1, BQ), lambda h, i: (h, 0, i))))(q, k, v)


@case("kernels/flash_attention_fwd_causal",
      tags={"kernels", "dot", "control_flow", "indexing", "reductions",
            "multiple_outputs"},
      inputs=_qkv, reference=_attention_reference, tolerance={"float32": (1e-4, 1e-4)})
def flash_fwd(pallas_call, q, k, v):
    """Causal flash attention forward: online softmax over key blocks below the diagonal."""
    return _flash_fwd(pallas_call, q, k, v)[0]


def _flash_bwd(pallas_call, q, k, v, o, lse, do):
    scale = 1.0 / math.sqrt(D)
    delta = jnp.sum(o * do, axis=-1)[:, None, :]  # (BH, 1, S), like lse

    def p_and_ds(qb, kb, vb, dob, lse_b, delta_b, qi, kj):
        s = jnp.dot(qb, kb.T, precision=HI) * scale
        rows = qi * BQ + lax.broadcasted_iota(jnp.int32, (BQ, BK), 0)
        cols = kj * BK + lax.broadcasted_iota(jnp.int32, (BQ, BK), 1)
        p = jnp.where(cols <= rows, jnp.exp(s - lse_b[:, None]), 0.0)
        dp = jnp.dot(dob, vb.T, precision=HI)
        ds = p * (dp - delta_b[:, None]) * scale
        return p, ds

    def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref):
        qi = pl.program_id(1)
        qb, dob, lse_b, delta_b = q_ref[...], do_ref[...], lse_ref[0], delta_ref[0]

        def body(j, dq):
            kb = k_ref[pl.ds(j * BK, BK), :]
            vb = v_ref[pl.ds(j * BK, BK), :]
            _, ds = p_and_ds(qb, kb, vb, dob, lse_b, delta_b, qi, j)
            return dq + jnp.dot(ds, kb, precision=HI)

        dq_ref[...] = lax.fori_loop(0, qi + 1, body, jnp.zeros((BQ, D), F32))

    def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref):
        kj = pl.program_id(1)
        kb, vb = k_ref[...], v_ref[...]

        def body(i, carry):
            dk, dv = carry
            qb = q_ref[pl.ds(i * BQ, BQ), :]
            dob = do_ref[pl.ds(i * BQ, BQ), :]
            lse_b = lse_ref[0, pl.ds(i * BQ, BQ)]
            delta_b = delta_ref[0, pl.ds(i * BQ, BQ)]
            p, ds = p_and_ds(qb, kb, vb, dob, lse_b, delta_b, i, kj)
            return dk + jnp.dot(ds.T, qb, precision=HI), dv + jnp.dot(p.T, dob, precision=HI)

        zeros = jnp.zeros((BK, D), F32)
        dk, dv = lax.fori_loop(kj, S // BQ, body, (zeros, zeros))  # causal: q blocks >= kj
        dk_ref[...] = dk
        dv_ref[...] = dv

    blk = pl.BlockSpec((None, BQ, D), lambda h, i: (h, i, 0))
    full = pl.BlockSpec((None, S, D), lambda h, i: (h, 0, 0))
    vblk = pl.BlockSpec((None, 1, BQ), lambda h, i: (h, 0, i))
    vfull = pl.BlockSpec((None, 1, S), lambda h, i: (h, 0, 0))
    dq = pallas_call(dq_kernel, out_shape=sds(q.shape, F32), grid=(BH, S // BQ),
                     in_specs=[blk, full, full, blk, vblk, vblk], out_specs=blk)(
        q, k, v, do, lse, delta)
    dk, dv = pallas_call(dkv_kernel, out_shape=(sds(k.shape, F32), sds(v.shape, F32)),
                         grid=(BH, S // BK), in_specs=[full, blk, blk, full, vfull, vfull],
                         out_specs=(blk, blk))(q, k, v, do, lse, delta)
    return dq, dk, dv


def _flash_bwd_reference(q, k, v, do):
    _, vjp = jax.vjp(_attention_reference, q, k, v)
    return vjp(do)


@case("kernels/flash_attention_bwd_causal",
      tags={"kernels", "dot", "control_flow", "indexing", "reductions",
            "multiple_outputs"},
      inputs=lambda rng: (*_qkv(rng), randn(rng, (BH, S, D))),
      reference=_flash_bwd_reference, tolerance={"float32": (2e-4, 2e-4)})
def flash_bwd(pallas_call, q, k, v, do):
    """Causal flash attention backward: the forward kernel (for o and lse), then a dq
    kernel looping over key blocks and a dk/dv kernel looping over query blocks."""
    o, lse = _flash_fwd(pallas_call, q, k, v)
    return _flash_bwd(pallas_call, q, k, v, o, lse, do)


# --- Paged attention (decode) ----------------------------------------------------------

NSEQ, NH, PD = 3, 2, 32  # sequences, heads, head dim
PAGE, NPAGES, PPS = 8, 16, 4  # page size, total pages, max pages per sequence


def _paged_inputs(rng):
    q = randn(rng, (NSEQ, NH, PD))
    k_pages = randn(rng, (NH, NPAGES, PAGE, PD))
    v_pages = randn(rng, (NH, NPAGES, PAGE, PD))
    lengths = jnp.asarray([13, 32, 1], jnp.int32)
    page_indices = jnp.asarray(rng.permutation(NPAGES)[: NSEQ * PPS].reshape(NSEQ, PPS),
                               jnp.int32)
    return lengths, page_indices, q, k_pages, v_pages


def _paged_reference(lengths, page_indices, q, k_pages, v_pages):
    k = k_pages[:, page_indices].reshape(NH, NSEQ, PPS * PAGE, PD)  # (h, s, t, d)
    v = v_pages[:, page_indices].reshape(NH, NSEQ, PPS * PAGE, PD)
    s = jnp.einsum("shd,hstd->sht", q, k, precision=HI) / math.sqrt(PD)
    valid = jnp.arange(PPS * PAGE)[None, None, :] < lengths[:, None, None]
    p = jax.nn.softmax(jnp.where(valid, s, -jnp.inf), axis=-1)
    return jnp.einsum("sht,hstd->shd", p, v, precision=HI)


@case("kernels/paged_attention",
      tags={"kernels", "scalar_prefetch", "dot", "control_flow", "indexing", "reductions"},
      inputs=_paged_inputs, reference=_paged_reference, tolerance={"float32": (1e-4, 1e-4)})
def paged_attention(pallas_call, lengths, page_indices, q, k_pages, v_pages):
    """Decode attention over a paged KV cache: scalar-prefetched lengths and page
    tables, a loop over the sequence's pages with a dynamic page index, and a masked
    tail."""
    scale = 1.0 / math.sqrt(PD)

    def kernel(len_ref, pi_ref, q_ref, k_ref, v_ref, o_ref):
        s_idx = pl.program_id(0)
        length = len_ref[s_idx]
        qv = q_ref[...] * scale  # (1, PD)

        def body(p, carry):
            m, l, acc = carry
            page = pi_ref[s_idx, p]
            kb = k_ref[page]  # (PAGE, PD)
            vb = v_ref[page]
            s = jnp.dot(qv, kb.T, precision=HI)  # (1, PAGE)
            pos = p * PAGE + lax.broadcasted_iota(jnp.int32, (1, PAGE), 1)
            s = jnp.where(pos < length, s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
            pr = jnp.exp(s - m_new)
            alpha = jnp.exp(m - m_new)
            return (m_new, alpha * l + jnp.sum(pr, axis=1, keepdims=True),
                    acc * alpha + jnp.dot(pr, vb, precision=HI))

        init = (jnp.full((1, 1), -jnp.inf, F32), jnp.zeros((1, 1), F32),
                jnp.zeros((1, PD), F32))
        m, l, acc = lax.fori_loop(0, pl.cdiv(length, PAGE), body, init)
        o_ref[...] = acc / l

    # One (1, PD) row of q per (sequence, head): q gets a unit dim rather than a squeezed
    # head dim, which a TPU cannot window (its (NH, PD) = (2, 32) tile is (2, 128)).
    kv_spec = pl.BlockSpec((None, NPAGES, PAGE, PD), lambda s, h, *_: (h, 0, 0, 0))
    q_spec = pl.BlockSpec((None, None, 1, PD), lambda s, h, *_: (s, h, 0, 0))
    q4 = q.reshape(NSEQ, NH, 1, PD)
    out = pallas_call(
        kernel, out_shape=sds(q4.shape, q.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(NSEQ, NH), in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec))(lengths, page_indices, q4, k_pages, v_pages)
    return out.reshape(q.shape)


# --- Tiled matmul with the reduction inside the kernel (no sequential grid needed) -----

def _matmul_kloop(pallas_call, a, b, *, bm=32, bn=128, bk=128):
    m, k = a.shape
    n = b.shape[1]

    def kernel(a_ref, b_ref, o_ref):
        def body(kk, acc):
            a_blk = a_ref[:, pl.ds(pl.multiple_of(kk * bk, bk), bk)]
            b_blk = b_ref[pl.ds(pl.multiple_of(kk * bk, bk), bk), :]
            return acc + jnp.dot(a_blk, b_blk, precision=HI, preferred_element_type=F32)

        acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), F32))
        o_ref[...] = acc.astype(o_ref.dtype)

    return pallas_call(
        kernel, out_shape=sds((m, n), a.dtype), grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)))(a, b)


@case("kernels/tiled_matmul_kloop_f32", tags={"kernels", "dot", "control_flow", "indexing"},
      inputs=lambda rng: (randn(rng, (64, 256)), randn(rng, (256, 256))),
      reference=lambda a, b: jnp.dot(a, b, precision=HI),
      tolerance={"float32": (1e-4, 1e-4)})
def tiled_matmul_kloop(pallas_call, a, b):
    """A (2, 2) grid of independent 32x128 output tiles, each looping over K in the
    kernel (the GPU formulation: no state carried between programs)."""
    return _matmul_kloop(pallas_call, a, b)


@case("kernels/tiled_matmul_kloop_bf16",
      tags={"kernels", "dot", "control_flow", "indexing", "bf16"},
      inputs=_bf16_matmul_inputs, reference=_bf16_matmul_reference,
      tolerance=_BF16_MATMUL_TOL)
def tiled_matmul_kloop_bf16(pallas_call, a, b):
    """bf16 operands, f32 accumulation in the loop carry, bf16 output."""
    return _matmul_kloop(pallas_call, a, b)


def _flash_fwd_static(pallas_call, q, k, v):
    """Causal flash attention forward whose key loop has a static trip count (every key
    block, the causal mask applied per element), so reverse mode can go through it."""
    scale = 1.0 / math.sqrt(D)

    def kernel(q_ref, k_ref, v_ref, o_ref):
        # A finite mask value: a fully masked block must not make exp(-inf - -inf).
        body, init = _online_softmax_step(q_ref[...] * scale, k_ref, v_ref,
                                          pl.program_id(1), -1e30)
        m, l, acc = lax.fori_loop(0, S // BK, body, init)
        o_ref[...] = acc / l[:, None]

    q_spec = pl.BlockSpec((None, BQ, D), lambda h, i: (h, i, 0))
    kv_spec = pl.BlockSpec((None, S, D), lambda h, i: (h, 0, 0))
    return pallas_call(kernel, out_shape=sds(q.shape, q.dtype), grid=(BH, S // BQ),
                       in_specs=[q_spec, kv_spec, kv_spec], out_specs=q_spec)(q, k, v)


def _attention_loss(attn):
    return lambda q, k, v: jnp.sum(attn(q, k, v) ** 2)


@case("kernels/flash_attention_grad_of_forward",
      tags={"kernels", "grad", "dot", "control_flow", "indexing", "reductions"},
      inputs=_qkv,
      reference=lambda q, k, v: jax.grad(_attention_loss(_attention_reference),
                                         argnums=(0, 1, 2))(q, k, v),
      tolerance={"float32": (2e-4, 2e-4)})
def flash_grad_of_fwd(pallas_call, q, k, v):
    """jax.grad through a flash-attention forward kernel (online softmax in a
    fori_loop over key blocks), with no hand-written backward kernel."""
    return jax.grad(_attention_loss(lambda *a: _flash_fwd_static(pallas_call, *a)),
                    argnums=(0, 1, 2))(q, k, v)


C = 128
BF16 = jnp.bfloat16


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
