"""Paged-attention decode for TPU: scalar prefetch plus manual double-buffered DMAs.

    python examples/tpu_paged_attention.py

Each sequence's keys and values live in fixed-size pages scattered through a page pool
in HBM (``memory_space=ANY``). The sequence lengths and page tables are scalar-prefetch
operands (SMEM). For each sequence the kernel walks its pages with a dynamic-length
loop, prefetching page ``p + 1`` into one VMEM slot while it computes on page ``p`` in
the other, with an online softmax across pages (multi-query attention: all query heads
share one KV head). Runs in TPU interpret mode against plain JAX, then lowers for TPU.
"""

from __future__ import annotations

import functools
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import pallas as pl  # noqa: E402
import pallas_tpu as pltpu  # noqa: E402

NEG_INF = -1e30


def paged_attention_kernel(lengths_ref, pages_ref, q_ref, k_hbm, v_hbm, o_ref,
                           k_buf, v_buf, sems, *, page_size, scale):
    b = pl.program_id(0)
    length = lengths_ref[b]
    n_pages = (length + page_size - 1) // page_size

    def copies(p, slot):
        page = pages_ref[b, p]
        return (pltpu.make_async_copy(k_hbm.at[page], k_buf.at[slot], sems.at[0, slot]),
                pltpu.make_async_copy(v_hbm.at[page], v_buf.at[slot], sems.at[1, slot]))

    @pl.when(n_pages > 0)
    def _():
        for c in copies(0, 0):
            c.start()

    q = q_ref[...].astype(jnp.float32) * scale  # (heads, head_dim)

    def body(p, carry):
        m, l, acc = carry
        slot = p % 2

        @pl.when(p + 1 < n_pages)
        def _():
            for c in copies(p + 1, 1 - slot):
                c.start()

        for c in copies(p, slot):
            c.wait()
        k = k_buf[slot].astype(jnp.float32)  # (page_size, head_dim)
        v = v_buf[slot].astype(jnp.float32)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)  # (heads, page_size)
        pos = p * page_size + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, NEG_INF)
        m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        w = jnp.exp(s - m_next)
        alpha = jnp.exp(m - m_next)
        l = alpha * l + jnp.sum(w, axis=1, keepdims=True)
        acc = alpha * acc + jnp.dot(w, v, preferred_element_type=jnp.float32)
        return m_next, l, acc

    heads, head_dim = q.shape
    init = (jnp.full((heads, 1), NEG_INF, jnp.float32), jnp.zeros((heads, 1), jnp.float32),
            jnp.zeros((heads, head_dim), jnp.float32))
    _, l, acc = lax.fori_loop(0, n_pages, body, init)
    o_ref[...] = (acc / jnp.maximum(l, 1e-30)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("interpret",))
def paged_attention(q, k_pages, v_pages, lengths, page_table, *, interpret=False):
    """q: (batch, heads, head_dim); k/v_pages: (num_pages, page_size, head_dim);
    lengths: (batch,) int32; page_table: (batch, pages_per_seq) int32."""
    batch, heads, head_dim = q.shape
    _, page_size, _ = k_pages.shape
    kernel = functools.partial(paged_attention_kernel, page_size=page_size,
                               scale=1.0 / math.sqrt(head_dim))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(batch,),
            in_specs=[pl.BlockSpec((None, heads, head_dim), lambda b, lens, pt: (b, 0, 0)),
                      pl.BlockSpec(memory_space=pl.ANY),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((None, heads, head_dim), lambda b, lens, pt: (b, 0, 0)),
            scratch_shapes=[pltpu.VMEM((2, page_size, head_dim), k_pages.dtype),
                            pltpu.VMEM((2, page_size, head_dim), v_pages.dtype),
                            pltpu.SemaphoreType.DMA((2, 2))],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
    )(lengths, page_table, q, k_pages, v_pages)


def reference(q, k_pages, v_pages, lengths, page_table):
    batch, heads, head_dim = q.shape
    _, page_size, _ = k_pages.shape
    k = k_pages[page_table].reshape(batch, -1, head_dim).astype(jnp.float32)
    v = v_pages[page_table].reshape(batch, -1, head_dim).astype(jnp.float32)
    s = jnp.einsum("bhd,btd->bht", q.astype(jnp.float32), k) / math.sqrt(head_dim)
    valid = jnp.arange(k.shape[1])[None, None, :] < lengths[:, None, None]
    p = jax.nn.softmax(jnp.where(valid, s, -jnp.inf), axis=-1)
    return jnp.einsum("bht,btd->bhd", p, v).astype(q.dtype)


def inputs(batch=3, heads=8, head_dim=128, page_size=128, pages_per_seq=4, num_pages=16):
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (batch, heads, head_dim), jnp.float32)
    k_pages = jax.random.normal(ks[1], (num_pages, page_size, head_dim), jnp.float32)
    v_pages = jax.random.normal(ks[2], (num_pages, page_size, head_dim), jnp.float32)
    perm = jax.random.permutation(ks[3], num_pages)[: batch * pages_per_seq]
    page_table = perm.reshape(batch, pages_per_seq).astype(jnp.int32)
    lengths = jnp.array([300, 512, 77][:batch], jnp.int32)
    return q, k_pages, v_pages, lengths, page_table


def main():
    from pallas_tpu.inspect import mosaic_modules, op_names

    args = inputs()
    got = paged_attention(*args, interpret=True)
    want = reference(*args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    lowered = paged_attention.trace(*args).lower(lowering_platforms=("tpu",))
    (module,) = mosaic_modules(lowered)
    ops = sorted(set(op_names(module)) - {"builtin.module"})
    print(f"tpu_paged_attention: interpret matches plain JAX (max abs err "
          f"{float(jnp.max(jnp.abs(got - want))):.2g}); lowered for TPU with {ops}")


if __name__ == "__main__":
    main()
