"""Autotuning benchmark: block sizes tuned by ``pallas.tuning`` against hand-picked defaults.

Three kernels on the CPU path (``pallas_call`` on the core interpreter backend): a
blocked matmul, a causal flash-attention forward and a row-blocked layer norm. For each,
the default config (the block sizes a user would write by hand, the first config of the
list) and the tuned one are timed the same way (``jax.jit``, one warm-up call, then the
median of ``--repeats`` calls with ``block_until_ready``, the two configs' calls
alternated so a change in the machine's load falls on both), and the search itself is
timed (``pallas.tuning.tune`` with an empty cache: tracing, pruning, compiling and
timing every config). "break-even" is how many calls of the tuned kernel repay the
search. The model's agreement with the measured ranking is Kendall's tau.

    hatch run python benchmarks/tuning.py            # full sizes
    hatch run python benchmarks/tuning.py --small    # a smoke run
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
from pallas import tuning


def matmul(x, y, *, bm, bn, bk):
    m, k = x.shape
    n = y.shape[1]

    def kernel(x_ref, y_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)))(x, y)


def flash_attention(q, k, v, *, block_q, block_k):
    heads, seq, d = q.shape
    scale = 1.0 / math.sqrt(d)

    def kernel(q_ref, k_ref, v_ref, o_ref):
        qi = pl.program_id(1)
        qb = q_ref[...].astype(jnp.float32) * scale
        rows = qi * block_q + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)

        def body(j, carry):
            m, s, acc = carry
            kb = k_ref[pl.ds(j * block_k, block_k), :].astype(jnp.float32)
            vb = v_ref[pl.ds(j * block_k, block_k), :].astype(jnp.float32)
            logits = jnp.dot(qb, kb.T)
            cols = j * block_k + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
            logits = jnp.where(cols <= rows, logits, -jnp.inf)
            m_new = jnp.maximum(m, logits.max(axis=1))
            p = jnp.exp(logits - m_new[:, None])
            corr = jnp.exp(m - m_new)
            return m_new, s * corr + p.sum(axis=1), acc * corr[:, None] + jnp.dot(p, vb)

        last = ((qi + 1) * block_q + block_k - 1) // block_k
        init = (jnp.full((block_q,), -jnp.inf), jnp.zeros((block_q,)),
                jnp.zeros((block_q, d)))
        _, s, acc = lax.fori_loop(0, last, body, init)
        o_ref[...] = (acc / s[:, None]).astype(o_ref.dtype)

    q_spec = pl.BlockSpec((None, block_q, d), lambda h, i: (h, i, 0))
    kv_spec = pl.BlockSpec((None, seq, d), lambda h, i: (h, 0, 0))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(heads, seq // block_q), in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec)(q, k, v)


def layer_norm(x, w, b, *, block_rows):
    rows, cols = x.shape

    def kernel(x_ref, w_ref, b_ref, o_ref):
        xb = x_ref[...]
        mean = xb.mean(axis=1, keepdims=True)
        var = ((xb - mean) ** 2).mean(axis=1, keepdims=True)
        o_ref[...] = (xb - mean) * lax.rsqrt(var + 1e-5) * w_ref[...] + b_ref[...]

    row = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    vec = pl.BlockSpec((1, cols), lambda i: (0, 0))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block_rows,), in_specs=[row, vec, vec], out_specs=row)(x, w, b)


def cases(small: bool):
    f32 = jnp.float32
    n = 256 if small else 1024
    mm = [{"bm": 128, "bn": 128, "bk": 128}] + [
        {"bm": a, "bn": b, "bk": c} for a, b, c in
        [(64, 64, 64), (256, 256, 256), (n, n, n), (256, 256, n), (n // 2, n, n),
         (64, 128, 256)]]
    mm = [c for i, c in enumerate(mm) if all(n % v == 0 for v in c.values())
          and c not in mm[:i]]
    h, s, d = (2, 256, 64) if small else (4, 1024, 64)
    fa = [{"block_q": 128, "block_k": 128}] + [
        {"block_q": a, "block_k": b} for a in (64, 256, 512) for b in (64, 256, 512)
        if s % a == 0 and s % b == 0]
    r, c = (1024, 256) if small else (8192, 1024)
    ln = [{"block_rows": 8}] + [{"block_rows": v} for v in (32, 128, 512, 2048)
                                if r % v == 0]
    rng = np.random.default_rng(0)

    def arr(*shape):
        return jnp.asarray(rng.standard_normal(shape), f32)

    return [
        ("matmul", matmul, mm, (arr(n, n), arr(n, n)),
         f"{n}x{n} @ {n}x{n} f32"),
        ("flash attention", flash_attention, fa, (arr(h, s, d), arr(h, s, d), arr(h, s, d)),
         f"{h} heads, seq {s}, d {d}, causal"),
        ("layer norm", layer_norm, ln, (arr(r, c), arr(1, c), arr(1, c)),
         f"{r}x{c} f32"),
    ]


def timed_pair(f, g, args, repeats: int) -> tuple[float, float]:
    """Medians of ``f`` and ``g``, their runs alternated so that a change in the
    machine's load falls on both."""
    f, g = jax.jit(f), jax.jit(g)
    jax.block_until_ready(f(*args))
    jax.block_until_ready(g(*args))
    times: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for fn, out in ((f, times[0]), (g, times[1])):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            out.append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    os.environ[tuning.ENV_CACHE] = os.path.join(tempfile.mkdtemp(), "bench.sqlite3")
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, repeats {a.repeats}", file=sys.stderr)
    rows = []
    for name, fn, configs, args, size in cases(a.small):
        print(f"{name}: {len(configs)} configs", file=sys.stderr)
        f = tuning.autotune(configs, warmup=1, repeats=a.repeats)(fn)
        t0 = time.perf_counter()
        report = tuning.tune(f, *args)
        search = time.perf_counter() - t0
        default, chosen = configs[0], report.chosen
        t_default, t_tuned = timed_pair(functools.partial(fn, **default),
                                        functools.partial(fn, **chosen), args, a.repeats)
        np.testing.assert_allclose(jax.jit(functools.partial(fn, **chosen))(*args),
                                   jax.jit(functools.partial(fn, **default))(*args),
                                   rtol=2e-3, atol=2e-3)
        gain = t_default - t_tuned
        even = f"{math.ceil(search / gain)}" if gain > 0 else "never"
        tau = report.model_agreement
        rows.append((name, size, len(configs), len(report.pruned), default, chosen,
                     t_default, t_tuned, search, even, tau))
        print(report, file=sys.stderr)
    print("| kernel | size | configs (pruned) | default | tuned | default ms | tuned ms "
          "| speed-up | search s | break-even calls | model tau |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, size, n, p, d, c, td, tt, s, even, tau) in rows:
        fmt = lambda cfg: ", ".join(f"{k}={v}" for k, v in cfg.items())  # noqa: E731
        print(f"| {name} | {size} | {n} ({p}) | {fmt(d)} | {fmt(c)} | {td * 1e3:.2f} | "
              f"{tt * 1e3:.2f} | {td / tt:.2f}x | {s:.1f} | {even} | "
              f"{'n/a' if tau is None else f'{tau:+.2f}'} |")


if __name__ == "__main__":
    main()
