"""The benchmark kernels a bundle carries: each a Pallas kernel and its plain-JAX
reference at a size that measures a GPU (matmul, causal flash attention forward and
backward, softmax, layer norm, an elementwise op at HBM bandwidth).

Only shapes are needed to export them (``jax.ShapeDtypeStruct``); the bundle's runner
makes the inputs on the device from a seed, so none are stored. The kernels are written
once for every backend with ``pl.pallas_call``; block sizes (what fits a Hopper block's
shared memory, what Triton keeps in registers) and compiler parameters are per backend.
``size="small"`` gives the same kernels at shapes the interpreter runs in seconds (for
testing a bundle on CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import pallas as pl

F32, BF16 = jnp.float32, jnp.bfloat16


@dataclasses.dataclass(frozen=True)
class Input:
    """One operand, made by the runner: ``normal(seed) * scale + shift`` as ``dtype``."""

    shape: tuple[int, ...]
    dtype: str
    scale: float = 1.0
    shift: float = 0.0

    def sds(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, jnp.dtype(self.dtype))

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "scale": self.scale,
                "shift": self.shift, "init": "normal"}


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A kernel, its reference, its inputs and what it moves or computes.

    ``flops`` (useful floating-point operations, the same count for kernel and
    reference) or ``bytes`` (the least HBM traffic: every operand read once, every
    result written once) give TFLOP/s or GB/s; ``tolerance`` is the (atol, rtol) of the
    check that the kernel's result is the reference's (a sanity check at scale: exact
    claims are the conformance cases')."""

    name: str
    kernel: Callable
    reference: Callable
    inputs: tuple[Input, ...]
    flops: float = 0.0
    bytes: float = 0.0
    tolerance: tuple[float, float] = (2e-2, 2e-2)
    description: str = ""


# --- kernels (``pallas_call`` is bound to the backend, as in the conformance cases) ---

def matmul(pallas_call, a, b, *, bm, bn, bk, out_dtype, precision=None):
    """``a @ b`` in (bm, bn) output blocks, a sequential K axis accumulating in f32
    scratch; M and N need not be multiples of the block (edge blocks are masked).
    ``precision`` is the dots' (the conformance case ``kernels/tiled_matmul_*`` runs it
    at ``HIGHEST``)."""
    m, k = a.shape
    n = b.shape[1]
    nk = k // bk

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=precision,
                                preferred_element_type=F32)

        @pl.when(pl.program_id(2) == nk - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    return pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), nk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pl.ANY((bm, bn), F32)])(a, b)


def matmul_reference(a, b, *, out_dtype):
    return jnp.dot(a, b, preferred_element_type=F32).astype(out_dtype)


def _causal_mask(qi, kj, bq, bk):
    rows = qi * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    cols = kj * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    return cols <= rows


def flash_fwd(pallas_call, q, k, v, *, bq, bk, with_lse=False):
    """Causal flash attention forward over ``(batch*heads, seq, head_dim)``: a grid
    (heads, query blocks, key blocks), the key axis sequential with the online-softmax
    state in scratch; key blocks above the diagonal are skipped. Returns ``o`` (and the
    log-sum-exp ``lse``, shaped ``(bh, 1, seq)``, for the backward pass)."""
    bh, s, d = q.shape
    nk = s // bk
    scale = 1.0 / math.sqrt(d)

    def kernel(q_ref, k_ref, v_ref, *refs):
        o_ref, lse_ref = (refs[0], refs[1]) if with_lse else (refs[0], None)
        m_ref, l_ref, acc_ref = refs[-3:]
        qi, kj = pl.program_id(1), pl.program_id(2)

        @pl.when(kj == 0)
        def _():
            m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, F32)
            l_ref[...] = jnp.zeros(l_ref.shape, F32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

        @pl.when(kj * bk <= qi * bq + bq - 1)
        def _():
            sc = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=F32) * scale
            sc = jnp.where(_causal_mask(qi, kj, bq, bk), sc, -jnp.inf)
            m = m_ref[...]
            m_new = jnp.maximum(m, jnp.max(sc, axis=1))
            p = jnp.exp(sc - m_new[:, None])
            alpha = jnp.exp(m - m_new)
            l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1)
            acc_ref[...] = acc_ref[...] * alpha[:, None] + jnp.dot(
                p.astype(v_ref.dtype), v_ref[...], preferred_element_type=F32)
            m_ref[...] = m_new

        @pl.when(kj == nk - 1)
        def _():
            l = l_ref[...]
            o_ref[...] = (acc_ref[...] / l[:, None]).astype(o_ref.dtype)
            if with_lse:
                lse_ref[...] = (m_ref[...] + jnp.log(l))[None, :]

    q_spec = pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0))
    kv_spec = pl.BlockSpec((None, bk, d), lambda h, i, j: (h, j, 0))
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    out_specs = [q_spec]
    if with_lse:
        out_shape.append(jax.ShapeDtypeStruct((bh, 1, s), F32))
        out_specs.append(pl.BlockSpec((None, 1, bq), lambda h, i, j: (h, 0, i)))
    out = pallas_call(
        kernel, out_shape=tuple(out_shape), grid=(bh, s // bq, nk),
        in_specs=[q_spec, kv_spec, kv_spec], out_specs=tuple(out_specs),
        scratch_shapes=[pl.ANY((bq,), F32), pl.ANY((bq,), F32), pl.ANY((bq, d), F32)],
    )(q, k, v)
    return out if with_lse else out[0]


def flash_bwd(pallas_call, q, k, v, do, *, bq, bk):
    """The gradients ``(dq, dk, dv)`` of causal attention: the forward kernel (for ``o``
    and ``lse``), then a dq kernel sequential over key blocks and a dk/dv kernel
    sequential over query blocks, each accumulating in f32 scratch."""
    bh, s, d = q.shape
    nq, nk = s // bq, s // bk
    scale = 1.0 / math.sqrt(d)
    o, lse = flash_fwd(pallas_call, q, k, v, bq=bq, bk=bk, with_lse=True)
    delta = jnp.sum(o.astype(F32) * do.astype(F32), axis=-1)[:, None, :]

    def p_ds(qb, kb, vb, dob, lse_b, delta_b, qi, kj):
        sc = jnp.dot(qb, kb.T, preferred_element_type=F32) * scale
        p = jnp.where(_causal_mask(qi, kj, bq, bk), jnp.exp(sc - lse_b[:, None]), 0.0)
        dp = jnp.dot(dob, vb.T, preferred_element_type=F32)
        return p, p * (dp - delta_b[:, None]) * scale

    def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, acc_ref):
        qi, kj = pl.program_id(1), pl.program_id(2)

        @pl.when(kj == 0)
        def _():
            acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

        @pl.when(kj * bk <= qi * bq + bq - 1)
        def _():
            kb = k_ref[...]
            _, ds = p_ds(q_ref[...], kb, v_ref[...], do_ref[...], lse_ref[0], delta_ref[0],
                         qi, kj)
            acc_ref[...] += jnp.dot(ds.astype(kb.dtype), kb, preferred_element_type=F32)

        @pl.when(kj == nk - 1)
        def _():
            dq_ref[...] = acc_ref[...].astype(dq_ref.dtype)

    def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                   dk_acc, dv_acc):
        kj, qi = pl.program_id(1), pl.program_id(2)

        @pl.when(qi == 0)
        def _():
            dk_acc[...] = jnp.zeros(dk_acc.shape, F32)
            dv_acc[...] = jnp.zeros(dv_acc.shape, F32)

        @pl.when(qi * bq + bq - 1 >= kj * bk)
        def _():
            qb, dob = q_ref[...], do_ref[...]
            p, ds = p_ds(qb, k_ref[...], v_ref[...], dob, lse_ref[0], delta_ref[0], qi, kj)
            dv_acc[...] += jnp.dot(p.astype(dob.dtype).T, dob, preferred_element_type=F32)
            dk_acc[...] += jnp.dot(ds.astype(qb.dtype).T, qb, preferred_element_type=F32)

        @pl.when(qi == nq - 1)
        def _():
            dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
            dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

    qblk = pl.BlockSpec((None, bq, d), lambda h, i, j: (h, i, 0))
    kblk = pl.BlockSpec((None, bk, d), lambda h, i, j: (h, j, 0))
    rowblk = pl.BlockSpec((None, 1, bq), lambda h, i, j: (h, 0, i))
    dq = pallas_call(
        dq_kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=(bh, nq, nk),
        in_specs=[qblk, kblk, kblk, qblk, rowblk, rowblk], out_specs=qblk,
        scratch_shapes=[pl.ANY((bq, d), F32)])(q, k, v, do, lse, delta)
    # The dk/dv grid is (heads, key blocks, query blocks): swap the roles of i and j.
    qblk_t = pl.BlockSpec((None, bq, d), lambda h, j, i: (h, i, 0))
    kblk_t = pl.BlockSpec((None, bk, d), lambda h, j, i: (h, j, 0))
    rowblk_t = pl.BlockSpec((None, 1, bq), lambda h, j, i: (h, 0, i))
    dk, dv = pallas_call(
        dkv_kernel, out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype),
                               jax.ShapeDtypeStruct(v.shape, v.dtype)),
        grid=(bh, nk, nq), in_specs=[qblk_t, kblk_t, kblk_t, qblk_t, rowblk_t, rowblk_t],
        out_specs=(kblk_t, kblk_t),
        scratch_shapes=[pl.ANY((bk, d), F32), pl.ANY((bk, d), F32)])(q, k, v, do, lse, delta)
    return dq, dk, dv


def attention_reference(q, k, v):
    """Causal attention in plain JAX (what XLA makes of it), f32 softmax."""
    s = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=F32) / math.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
    return jnp.einsum("hqk,hkd->hqd", p.astype(v.dtype), v,
                      preferred_element_type=F32).astype(q.dtype)


def attention_bwd_reference(q, k, v, do):
    _, vjp = jax.vjp(attention_reference, q, k, v)
    return vjp(do)


def rowwise(pallas_call, body, x, *params, block_rows):
    """``body`` over blocks of whole rows (softmax, layer norm)."""
    rows, cols = x.shape

    def kernel(x_ref, *refs):
        *p_refs, o_ref = refs
        o_ref[...] = body(x_ref[...], *(r[...] for r in p_refs)).astype(o_ref.dtype)

    row = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    vec = pl.BlockSpec((cols,), lambda i: (0,))
    return pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       grid=(pl.cdiv(rows, block_rows),),
                       in_specs=[row] + [vec] * len(params), out_specs=row)(x, *params)


def softmax_body(x):
    x = x.astype(F32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def layer_norm_body(x, g, b, eps=1e-5):
    x = x.astype(F32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * g + b


def axpy(pallas_call, x, y, *, block):
    """``2 x + y`` over a 2-D grid of blocks: one read of each operand, one write."""
    spec = pl.BlockSpec(block, lambda i, j: (i, j))

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = 2.0 * x_ref[...] + y_ref[...]

    return pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       grid=(pl.cdiv(x.shape[0], block[0]), pl.cdiv(x.shape[1], block[1])),
                       in_specs=[spec, spec], out_specs=spec)(x, y)


# --- per-backend blocks and sizes ----------------------------------------------------

# Blocks per backend: Triton keeps blocks in registers (fewer elements per program),
# Mosaic GPU stages them through a Hopper block's 227 KiB of shared memory.
BLOCKS = {
    "triton": dict(mm_bf16=(128, 128, 64), mm_f32=(64, 64, 32), attn=(128, 64), rows=8,
                   ew=(32, 1024)),
    "mosaic_gpu": dict(mm_bf16=(128, 128, 64), mm_f32=(64, 64, 64), attn=(64, 64), rows=4,
                       ew=(8, 1024)),
    "interpret": dict(mm_bf16=(64, 64, 64), mm_f32=(64, 64, 64), attn=(64, 64), rows=8,
                      ew=(64, 256)),
}

SIZES = {
    # matmul (m, k, n), ragged (m, k, n), attention (batch*heads, seq, head_dim),
    # rows x cols of softmax / layer norm, elementwise shape
    "full": dict(mm=(4096, 4096, 4096), ragged=(4000, 4096, 3000), attn=(32, 4096, 64),
                 rows=(16384, 2048), ew=(8192, 16384)),
    "small": dict(mm=(128, 128, 128), ragged=(100, 128, 72), attn=(2, 128, 64),
                  rows=(32, 256), ew=(128, 512)),
}


def compiler_params(backend: str):
    """What the benchmarks pass as ``compiler_params`` for ``backend`` (None: defaults)."""
    if backend == "triton":
        import pallas_triton as pltriton

        return pltriton.CompilerParams(num_warps=4, num_stages=3)
    return None


def benchmarks(backend: str, size: str = "full") -> list[Benchmark]:
    """The benchmark kernels for ``backend`` at ``size`` ("full" or "small")."""
    blk = BLOCKS.get(backend, BLOCKS["interpret"])
    sz = SIZES[size]
    kw = {"interpret": True} if backend == "interpret" else {"backend": backend}
    params = compiler_params(backend)
    if params is not None:
        kw["compiler_params"] = params
    call = functools.partial(pl.pallas_call, **kw)
    out: list[Benchmark] = []

    def mm(name, m, k, n, dtype, blocks, desc):
        bm, bn, bk = blocks
        out.append(Benchmark(
            name, functools.partial(matmul, call, bm=bm, bn=bn, bk=bk, out_dtype=dtype),
            functools.partial(matmul_reference, out_dtype=dtype),
            (Input((m, k), dtype), Input((k, n), dtype, scale=1 / math.sqrt(k))),
            flops=2.0 * m * n * k, description=desc))

    m, k, n = sz["mm"]
    mm(f"bench/matmul_bf16_{m}x{k}x{n}", m, k, n, "bfloat16", blk["mm_bf16"],
       "bf16 matmul, f32 accumulation in scratch over a sequential K axis")
    mm(f"bench/matmul_f32_{m}x{k}x{n}", m, k, n, "float32", blk["mm_f32"],
       "f32 matmul at default precision (TF32 where the compiler uses it, as XLA does)")
    m, k, n = sz["ragged"]
    mm(f"bench/matmul_bf16_ragged_{m}x{k}x{n}", m, k, n, "bfloat16", blk["mm_bf16"],
       "bf16 matmul whose M and N are not multiples of the block (masked edge blocks)")

    bh, s, d = sz["attn"]
    bq, bk = blk["attn"]
    qkv = tuple(Input((bh, s, d), "bfloat16") for _ in range(3))
    fwd_flops = 4.0 * bh * s * s * d / 2  # two matmuls, half of them under the mask
    out.append(Benchmark(
        f"bench/flash_attention_fwd_causal_{bh}x{s}x{d}",
        functools.partial(flash_fwd, call, bq=bq, bk=bk), attention_reference, qkv,
        flops=fwd_flops, tolerance=(3e-2, 3e-2),
        description="causal flash attention forward, bf16, (batch*heads, seq, head_dim)"))
    out.append(Benchmark(
        f"bench/flash_attention_bwd_causal_{bh}x{s}x{d}",
        functools.partial(flash_bwd, call, bq=bq, bk=bk), attention_bwd_reference,
        qkv + (Input((bh, s, d), "bfloat16"),),
        flops=3.5 * fwd_flops, tolerance=(5e-2, 5e-2),
        description="causal flash attention backward (forward, dq, dk/dv kernels) against "
                    "jax.vjp of the reference; FLOPs counted as 2.5x forward + forward"))

    rows, cols = sz["rows"]
    nbytes = 2.0 * rows * cols * 4
    out.append(Benchmark(
        f"bench/softmax_f32_{rows}x{cols}",
        functools.partial(rowwise, call, softmax_body, block_rows=blk["rows"]),
        lambda x: jax.nn.softmax(x, axis=-1), (Input((rows, cols), "float32", 4.0),),
        bytes=nbytes, tolerance=(1e-5, 1e-4), description="row softmax, f32"))
    out.append(Benchmark(
        f"bench/layer_norm_f32_{rows}x{cols}",
        functools.partial(rowwise, call, layer_norm_body, block_rows=blk["rows"]),
        layer_norm_body,
        (Input((rows, cols), "float32", 2.0, 1.0), Input((cols,), "float32"),
         Input((cols,), "float32")),
        bytes=nbytes, tolerance=(1e-4, 1e-4), description="layer norm with scale and bias, f32"))

    r, c = sz["ew"]
    out.append(Benchmark(
        f"bench/axpy_f32_{r}x{c}", functools.partial(axpy, call, block=blk["ew"]),
        lambda x, y: 2.0 * x + y, (Input((r, c), "float32"), Input((r, c), "float32")),
        bytes=3.0 * r * c * 4, tolerance=(1e-6, 1e-6),
        description="2x + y, f32: HBM bandwidth"))
    return out
