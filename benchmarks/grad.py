"""Reverse mode benchmark: forward + backward of Pallas kernels against ``jax.grad`` of
plain JAX, in the same run.

For each kernel, ``jax.jit(jax.value_and_grad(loss))`` where ``loss`` sums the squares of
the kernel's output, timed three ways on this machine's CPU:

* **plain**: the same computation written in plain JAX (XLA);
* **kernels**: ``pallas_call`` without ``interpret=True`` (on CPU the built-in
  ``interpret`` backend runs it): the forward kernel and the **backward kernels**
  pallas-core generates (one ``pallas_call`` per differentiated input);
* **expansion**: ``interpret=True``: the backward pass is the interpreter's expansion
  transposed by JAX (the reference path, and what compiled backends fall back to).

Each is warmed up once (compilation excluded), then run ``--repeats`` times; the table
reports medians and the ratios to plain JAX, and the number of backward ``pallas_call``s
(counting the forward call that saves carried state, where there is one).
Results are checked against plain JAX (✗ marks a mismatch).

    python benchmarks/grad.py            # full sizes
    python benchmarks/grad.py --small    # smoke run
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import pallas as pl
from pallas_conformance.cases.grad import flash_grid_kv

HI = jax.lax.Precision.HIGHEST


def softmax(x, *, block_rows, interpret):
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        e = jnp.exp(v - jnp.max(v, axis=-1, keepdims=True))
        o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)

    spec = pl.BlockSpec((block_rows, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // block_rows,), in_specs=[spec], out_specs=spec,
                          interpret=interpret)(x)


def layer_norm(x, g, b, *, block_rows, interpret):
    def kernel(x_ref, g_ref, b_ref, o_ref):
        v = x_ref[...]
        mu = jnp.mean(v, axis=-1, keepdims=True)
        var = jnp.mean((v - mu) ** 2, axis=-1, keepdims=True)
        o_ref[...] = (v - mu) * jax.lax.rsqrt(var + 1e-5) * g_ref[...] + b_ref[...]

    n = x.shape[1]
    row = pl.BlockSpec((block_rows, n), lambda i: (i, 0))
    vec = pl.BlockSpec((1, n), lambda i: (0, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // block_rows,), in_specs=[row, vec, vec],
                          out_specs=row, interpret=interpret)(x, g, b)


def matmul(x, w, *, block, interpret):
    def kernel(x_ref, w_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], w_ref[...], precision=HI)

    (m, k), n = x.shape, w.shape[1]
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // block, n // block, k // block),
        in_specs=[pl.BlockSpec((block, block), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((block, block), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((block, block), lambda i, j, kk: (i, j)),
        interpret=interpret)(x, w)


def flash_attention(q, k, v, *, block, interpret):
    """Causal flash-attention forward: per query block, a fori_loop over every key
    block (online softmax, causal mask per element) reading ``k_ref``/``v_ref``."""
    h, s, d = q.shape
    scale = 1.0 / d ** 0.5

    def kernel(q_ref, k_ref, v_ref, o_ref):
        qi = pl.program_id(1)
        qb = q_ref[...] * scale

        def body(j, carry):
            m, l, acc = carry
            kb = k_ref[pl.ds(j * block, block), :]
            vb = v_ref[pl.ds(j * block, block), :]
            sc = jnp.dot(qb, kb.T, precision=HI)
            rows = qi * block + jax.lax.broadcasted_iota(jnp.int32, sc.shape, 0)
            cols = j * block + jax.lax.broadcasted_iota(jnp.int32, sc.shape, 1)
            sc = jnp.where(cols <= rows, sc, -1e30)
            m_new = jnp.maximum(m, jnp.max(sc, axis=1))
            p = jnp.exp(sc - m_new[:, None])
            alpha = jnp.exp(m - m_new)
            return (m_new, alpha * l + jnp.sum(p, axis=1),
                    acc * alpha[:, None] + jnp.dot(p, vb, precision=HI))

        init = (jnp.full((block,), -1e30, jnp.float32), jnp.zeros((block,), jnp.float32),
                jnp.zeros((block, d), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, s // block, body, init)
        o_ref[...] = acc / l[:, None]

    q_spec = pl.BlockSpec((None, block, d), lambda b, i: (b, i, 0))
    kv_spec = pl.BlockSpec((None, s, d), lambda b, i: (b, 0, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
                          grid=(h, s // block), in_specs=[q_spec, kv_spec, kv_spec],
                          out_specs=q_spec, interpret=interpret)(q, k, v)


def flash_attention_grid_kv(q, k, v, *, block, interpret):
    """Flash-attention forward (non-causal) with the key axis on the grid: the
    conformance case ``grad/flash_attention_grid_kv``'s kernel (online-softmax state in
    scratch, carried from one key step to the next; its backward pass: a forward call
    saving the state, a reverse state sweep, one call per input)."""
    call = functools.partial(pl.pallas_call, interpret=interpret)
    return flash_grid_kv(call, q, k, v, block=block)


def _attention_full_ref(q, k, v):
    s = jnp.einsum("hqd,hkd->hqk", q, k, precision=HI) / q.shape[-1] ** 0.5
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v, precision=HI)


def _attention_ref(q, k, v):
    s = jnp.einsum("hqd,hkd->hqk", q, k, precision=HI) / q.shape[-1] ** 0.5
    mask = jnp.tril(jnp.ones(s.shape[1:], bool))
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(jnp.where(mask, s, -1e30), axis=-1),
                      v, precision=HI)


def masked_softmax(x, *, block_rows, width, interpret):
    """Row softmax over the first ``width`` lanes, read and written with masked
    ``pl.load``/``pl.store`` (the Triton pattern for rows narrower than the block)."""
    def kernel(x_ref, o_ref):
        col = jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
        x = pl.load(x_ref, (slice(None), slice(None)), mask=col < width, other=-jnp.inf)
        e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
        o_ref[...] = jnp.zeros_like(o_ref)
        pl.store(o_ref, (slice(None), slice(None)),
                 e / jnp.sum(e, axis=1, keepdims=True), mask=col < width)

    spec = pl.BlockSpec((block_rows, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // block_rows,), in_specs=[spec],
                          out_specs=spec, interpret=interpret)(x)


def _masked_softmax_ref(x, width):
    keep = jnp.arange(x.shape[1]) < width
    return jnp.where(keep, jax.nn.softmax(jnp.where(keep, x, -jnp.inf), axis=-1), 0.0)


def _ln_ref(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b


def cases(small: bool):
    key = iter(jax.random.split(jax.random.key(0), 16))
    normal = lambda *s: jax.random.normal(next(key), s, jnp.float32)  # noqa: E731
    r, n, mm, blk = (64, 256, 256, 64) if small else (1024, 1024, 1024, 256)
    h, sq, d, ab = (2, 128, 32, 32) if small else (4, 1024, 64, 128)
    w = n - n // 4 - 3
    return [
        (f"masked softmax {r}x{n} (first {w} lanes), {r // 8} row blocks",
         functools.partial(masked_softmax, block_rows=8 if small else 128, width=w),
         lambda x: _masked_softmax_ref(x, w), (normal(r, n),)),
        (f"causal flash attention fwd h{h} s{sq} d{d}, {ab} blocks, grad wrt q, k, v",
         functools.partial(flash_attention, block=ab), _attention_ref,
         (normal(h, sq, d), normal(h, sq, d), normal(h, sq, d))),
        (f"flash attention fwd h{h} s{sq} d{d}, key axis on the grid ({ab} blocks), "
         f"grad wrt q, k, v", functools.partial(flash_attention_grid_kv, block=ab),
         _attention_full_ref, (normal(h, sq, d), normal(h, sq, d), normal(h, sq, d))),
        (f"softmax {r}x{n}, {r // 8} row blocks", functools.partial(softmax, block_rows=8 if
                                                                       small else 128),
         lambda x: jax.nn.softmax(x, axis=-1), (normal(r, n),)),
        (f"layer norm {r}x{n}, grad wrt x, gamma, beta",
         functools.partial(layer_norm, block_rows=8 if small else 128), _ln_ref,
         (normal(r, n), 1 + 0.1 * normal(1, n), 0.1 * normal(1, n))),
        (f"matmul {mm}^3, {blk}^3 blocks, k-accumulation",
         functools.partial(matmul, block=blk), lambda x, w: jnp.dot(x, w, precision=HI),
         (normal(mm, mm) * 0.1, normal(mm, mm) * 0.1)),
    ]


def timed(fn, args, repeats):
    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def backward_calls(fn, args) -> int:
    found = 0
    def walk(j):
        nonlocal found
        for e in j.eqns:
            if e.primitive is pl.pallas_call_p and ("(backward," in e.params["name"] or
                                                    "(forward, saving" in e.params["name"]):
                found += 1
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                walk(sub)
    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"jax {jax.__version__}, pallas {pl.__version__}, {jax.devices()[0].platform}, "
          f"median of {args.repeats}\n")
    rows = []
    for name, kernel, ref, inputs in cases(args.small):
        def grad(f, n=len(inputs)):
            return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a) ** 2),
                                              argnums=tuple(range(n))))

        plain = grad(ref)
        kern = grad(functools.partial(kernel, interpret=False))
        expn = grad(functools.partial(kernel, interpret=True))
        tp, want = timed(plain, inputs, args.repeats)
        tk, got_k = timed(kern, inputs, args.repeats)
        te, got_e = timed(expn, inputs, args.repeats)
        def ok(got, want=want):
            return all(np.allclose(a, b, rtol=2e-3, atol=2e-3)
                       for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))

        rows.append((name, backward_calls(kern, inputs), tp, tk, ok(got_k), te, ok(got_e)))
    print("| kernel (value_and_grad) | backward calls | plain JAX ms | kernels ms | "
          "expansion ms | kernels/plain | expansion/plain |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, nb, tp, tk, okk, te, oke in rows:
        print(f"| {name} | {nb} | {tp * 1e3:.1f} | {tk * 1e3:.1f}{'' if okk else ' ✗'} | "
              f"{te * 1e3:.1f}{'' if oke else ' ✗'} | {tk / tp:.2f}x | {te / tp:.2f}x |")
    return 0 if all(r[4] and r[6] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
