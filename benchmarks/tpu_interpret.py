"""TPU interpret mode (``interpret=pltpu.InterpretParams(...)``) against upstream's.

Each kernel is written once, as a function of the Pallas modules ``(pl, pltpu)``, and
runs on upstream's TPU interpret mode (JAX 0.10.2) and on this project's, with race
detection off and on. Every result is checked against plain JAX before it is timed.

    python benchmarks/tpu_interpret.py             # full sizes
    python benchmarks/tpu_interpret.py --small     # smoke run
    python benchmarks/tpu_interpret.py --only matmul --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def make_matmul(pl, pltpu, n, b):
    """``n``³ f32 matmul in ``b``³ blocks, accumulating in a VMEM scratch."""

    def kernel(a_ref, b_ref, o_ref, acc):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc[...] = jnp.zeros_like(acc)

        acc[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc[...]

    def call(params):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
            grid=(n // b, n // b, n // b),
            in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)),
                      pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
            interpret=params)

    k1, k2 = jax.random.split(jax.random.key(0))
    args = (jax.random.normal(k1, (n, n)), jax.random.normal(k2, (n, n)))
    return call, args, lambda a, c: a @ c, 1e-3


def make_pipeline(pl, pltpu, rows, b):
    """A manual double-buffered DMA pipeline: ``rows`` x 128 f32 streamed from HBM in
    ``b``-row chunks, the next chunk's copy in flight while the current one is used."""

    def kernel(x_hbm, o_ref, buf, sem):
        i, n = pl.program_id(0), pl.num_programs(0)
        slot = i % 2

        def copy(j, s):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(j * b, b)], buf.at[s], sem.at[s])

        @pl.when(i == 0)
        def _():
            copy(0, 0).start()

        @pl.when(i + 1 < n)
        def _():
            copy(i + 1, 1 - slot).start()

        copy(i, slot).wait()
        o_ref[...] = jnp.tanh(buf[slot]) * 2.0 + 1.0

    def call(params):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
            grid=(rows // b,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((b, 128), lambda i: (i, 0)),
            scratch_shapes=[pltpu.VMEM((2, b, 128), jnp.float32),
                            pltpu.SemaphoreType.DMA((2,))],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
            interpret=params)

    x = jax.random.normal(jax.random.key(1), (rows, 128))
    return call, (x,), lambda x: jnp.tanh(x) * 2.0 + 1.0, 1e-5


def make_paged_attention(pl, pltpu, heads, pages, page, d):
    """Decode-step paged attention: per head, the query attends to ``pages`` pages of
    ``page`` keys/values, fetched from HBM by DMA through a scalar-prefetched page table
    (one page's copy in flight while the previous one is used), with an online softmax."""

    def kernel(table, q_ref, k_hbm, v_hbm, o_ref, kbuf, vbuf, sem):
        h = pl.program_id(0)

        def copies(p, s):
            page_id = table[p]
            return (pltpu.make_async_copy(k_hbm.at[h, page_id], kbuf.at[s], sem.at[0, s]),
                    pltpu.make_async_copy(v_hbm.at[h, page_id], vbuf.at[s], sem.at[1, s]))

        for c in copies(0, 0):
            c.start()
        q = q_ref[...]  # (1, d)

        def body(p, carry):
            m, l, acc = carry
            slot = p % 2

            @pl.when(p + 1 < pages)
            def _():
                for c in copies(p + 1, 1 - slot):
                    c.start()

            for c in copies(p, slot):
                c.wait()
            s = jnp.dot(q, kbuf[slot].T, preferred_element_type=jnp.float32)  # (1, page)
            m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
            alpha = jnp.exp(m - m_new)
            e = jnp.exp(s - m_new)
            l = alpha * l + e.sum(axis=-1, keepdims=True)
            acc = alpha * acc + jnp.dot(e, vbuf[slot], preferred_element_type=jnp.float32)
            return m_new, l, acc

        init = (jnp.full((1, 1), -jnp.inf, jnp.float32), jnp.zeros((1, 1), jnp.float32),
                jnp.zeros((1, d), jnp.float32))
        _, l, acc = jax.lax.fori_loop(0, pages, body, init)
        o_ref[...] = acc / l

    total = 2 * pages

    def call(params):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((heads, 1, d), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(heads,),
                in_specs=[pl.BlockSpec((None, 1, d), lambda h, t: (h, 0, 0)),
                          pl.BlockSpec(memory_space=pl.ANY),
                          pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((None, 1, d), lambda h, t: (h, 0, 0)),
                scratch_shapes=[pltpu.VMEM((2, page, d), jnp.float32),
                                pltpu.VMEM((2, page, d), jnp.float32),
                                pltpu.SemaphoreType.DMA((2, 2))]),
            interpret=params)

    ks = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(ks[0], (heads, 1, d))
    k = jax.random.normal(ks[1], (heads, total, page, d))
    v = jax.random.normal(ks[2], (heads, total, page, d))
    table = jnp.asarray(np.random.default_rng(0).permutation(total)[:pages], jnp.int32)

    def reference(table, q, k, v):
        kk = k[:, table].reshape(heads, pages * page, d)
        vv = v[:, table].reshape(heads, pages * page, d)
        w = jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, kk), axis=-1)
        return jnp.einsum("hqk,hkd->hqd", w, vv)

    return call, (table, q, k, v), reference, 1e-4


KERNELS = {
    "matmul": (make_matmul, dict(n=512, b=128), dict(n=256, b=128)),
    "dma_pipeline": (make_pipeline, dict(rows=2048, b=64), dict(rows=256, b=64)),
    "paged_attention": (make_paged_attention, dict(heads=4, pages=16, page=64, d=128),
                        dict(heads=2, pages=4, page=16, d=128)),
}


def _median_ms(f, args, repeats):
    """Medians of the wall time and of the process's CPU time (all threads) per call."""
    jax.block_until_ready(f(*args))  # compile and warm up (not timed)
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        jax.block_until_ready(f(*args))
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def _modules(which):
    if which == "upstream":
        from jax.experimental import pallas as upl
        from jax.experimental.pallas import tpu as upltpu

        return upl, upltpu
    import pallas as pl
    import pallas_tpu as pltpu

    return pl, pltpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--only", action="append", choices=sorted(KERNELS))
    ap.add_argument("--repeats", type=int, default=5)
    opts = ap.parse_args()
    rows = []
    for name in opts.only or KERNELS:
        make, full, small = KERNELS[name]
        sizes = small if opts.small else full
        res = {}
        for impl in ("upstream", "ours"):
            pl, pltpu = _modules(impl)
            for races in (False, True):
                call, args, ref, tol = make(pl, pltpu, **sizes)
                f = jax.jit(call(pltpu.InterpretParams(detect_races=races)))
                np.testing.assert_allclose(f(*args), ref(*args), rtol=tol, atol=tol)
                res[impl, races] = _median_ms(f, args, opts.repeats)
        rows.append((name, sizes, res))
    for k, what in enumerate(("wall time", "CPU time (all threads of the process)")):
        print(f"\nMedian {what} per call:\n")
        print("| kernel | upstream off | ours off | speed-up | upstream races | ours races "
              "| speed-up | ours races / off |")
        print("|---|---|---|---|---|---|---|---|")
        for name, sizes, res in rows:
            r = {key: v[k] for key, v in res.items()}
            desc = ", ".join(f"{a}={b}" for a, b in sizes.items())
            print(f"| {name} ({desc}) | {r['upstream', False]:.1f} ms"
                  f" | {r['ours', False]:.1f} ms"
                  f" | {r['upstream', False] / r['ours', False]:.1f}x"
                  f" | {r['upstream', True]:.1f} ms | {r['ours', True]:.1f} ms"
                  f" | {r['upstream', True] / r['ours', True]:.1f}x"
                  f" | {r['ours', True] / r['ours', False]:.2f}x |")


if __name__ == "__main__":
    main()
