"""A partitioned ``pallas_call`` (sharded operands under ``jax.jit``, no ``shard_map``)
against the same kernel in a hand-written ``shard_map``, on 8 CPU devices: time medians
and the collectives in each compiled module.

    python benchmarks/sharded.py [--repeats 30] [--small]

Sets ``--xla_force_host_platform_device_count=8`` itself (before JAX starts); the
kernels run on the core interpreter (the numbers there are what CPUs can show).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
import warnings

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import pallas as pl  # noqa: E402

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
               "reduce-scatter")


def matmul(x, y, b=64):
    (m, k), (_, n) = x.shape, y.shape

    def kernel(x_ref, y_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...] @ y_ref[...]

    return pl.pallas_call(
        kernel, jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // b, n // b, k // b),
        in_specs=[pl.BlockSpec((b, b), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((b, b), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((b, b), lambda i, j, kk: (i, j)), interpret=True)(x, y)


def attention(q, k, v, bq=64):
    b, h, s, d = q.shape

    def kernel(q_ref, k_ref, v_ref, o_ref):
        rows = pl.program_id(2) * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, s), 0)
        cols = jax.lax.broadcasted_iota(jnp.int32, (bq, s), 1)
        logits = jnp.where(cols <= rows, q_ref[...] @ k_ref[...].T, -1e30)
        p = jnp.exp(logits - logits.max(-1, keepdims=True))
        o_ref[...] = (p / p.sum(-1, keepdims=True)) @ v_ref[...]

    blk = pl.BlockSpec((None, None, bq, d), lambda bi, hi, qi: (bi, hi, qi, 0))
    kv = pl.BlockSpec((None, None, s, d), lambda bi, hi, qi: (bi, hi, 0, 0))
    return pl.pallas_call(kernel, jax.ShapeDtypeStruct(q.shape, q.dtype),
                          grid=(b, h, s // bq), in_specs=[blk, kv, kv], out_specs=blk,
                          interpret=True)(q, k, v)


def collectives(compiled) -> str:
    text = compiled.as_text()
    found = {c: len(re.findall(rf"\b{c}(-start)?\(", text)) for c in COLLECTIVES}
    return ", ".join(f"{c} {n}" for c, n in found.items() if n) or "none"


def median_ms(f, args, repeats):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)
    n = 256 if a.small else 512
    x, y = (jnp.asarray(rng.normal(size=(n, n)), jnp.float32) for _ in range(2))
    q, k, v = (jnp.asarray(rng.normal(size=(2, 4, n, 64)), jnp.float32) for _ in range(3))
    cases = [
        ("matmul x rows, y columns", matmul, (x, y), (P("a", None), P(None, "b")),
         P("a", "b")),
        ("causal attention batch x heads", attention, (q, k, v), (P("a", "b"),) * 3,
         P("a", "b")),
        ("matmul x, y along k (gathered)", matmul, (x, y), (P(None, "b"), P("b", None)),
         None),
    ]
    print(f"jax {jax.__version__}, {jax.device_count()} CPU devices, mesh 2x4, "
          f"median of {a.repeats}")
    print("| case | partitioned (ms) | shard_map by hand (ms) | ratio | partitioned "
          "collectives | shard_map collectives |")
    print("|---|---|---|---|---|---|")
    for name, fn, args, specs, out_spec in cases:
        args = [jax.device_put(t, NamedSharding(mesh, s)) for t, s in zip(args, specs)]
        part = jax.jit(fn)
        if out_spec is None:  # the hand-written version gathers what it cannot split
            hand = jax.jit(lambda *xs, fn=fn: jax.shard_map(
                fn, mesh=mesh, in_specs=(P(), P()), out_specs=P(), check_vma=False)(*xs))
        else:
            hand = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=out_spec,
                                         check_vma=False))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.testing.assert_allclose(np.asarray(part(*args)), np.asarray(hand(*args)),
                                       rtol=2e-3, atol=2e-3)
            cp, ch = part.lower(*args).compile(), hand.lower(*args).compile()
            tp, th = median_ms(part, args, a.repeats), median_ms(hand, args, a.repeats)
        print(f"| {name} | {tp:.2f} | {th:.2f} | {tp / th:.2f} | {collectives(cp)} | "
              f"{collectives(ch)} |")


if __name__ == "__main__":
    main()
