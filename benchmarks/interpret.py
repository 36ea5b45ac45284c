"""Interpreter benchmark: our Pallas interpreter against upstream Pallas and plain JAX.

Each kernel is written once, as a function of a Pallas module ``pl``, so the identical
kernel source runs on

* **ours**: ``import pallas as pl`` with ``pl.pallas_call(..., interpret=True)``;
* **upstream**: ``from jax.experimental import pallas as upl`` (JAX 0.10.2), also with
  ``interpret=True``;

and both are compared with a **plain JAX** reference of the same computation. Every
implementation is wrapped in ``jax.jit``, warmed up once (compilation is excluded from the
timings), then run ``--repeats`` times with ``jax.block_until_ready``; the table reports
the median wall time and the ratios ours/plain, upstream/plain and upstream/ours. Each
result is checked against the reference with ``allclose``; a mismatch is marked with ✗.

Kernels (full size; ``--small`` shrinks them for a smoke run):

* ``matmul``: 1024x1024 @ 1024x1024 f32, 128x128x128 blocks, grid (M/bm, N/bn, K/bk),
  accumulating over the k axis into the f32 output block, initialised under
  ``pl.when(pl.program_id(2) == 0)``.
* ``attention``: causal flash-attention forward, batch 1, 4 heads, sequence 2048, head
  dimension 128, 128x128 blocks; grid (batch, heads, q blocks), an inner ``lax.fori_loop``
  over kv blocks up to the causal limit with an online softmax. The reference is the
  non-fused ``softmax(mask(Q K^T)) V``.
* ``elementwise``: ``sin(x) * 2 + tanh(y)`` over 4096x4096 f32 with 512x512 blocks.

Run from the repository root::

    python benchmarks/interpret.py                  # everything, full sizes
    python benchmarks/interpret.py --small          # quick smoke run
    python benchmarks/interpret.py --only matmul --repeats 3 --skip-upstream

If ``import pallas`` fails, the "ours" column reads "n/a" and the cause is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# --------------------------------------------------------------------------------------
# Kernels, each written once against a Pallas module `pl`.
# --------------------------------------------------------------------------------------


def make_matmul(pl: Any, *, m: int, n: int, k: int, bm: int, bn: int, bk: int) -> Callable:
    """Blocked matmul accumulating over the k grid axis into the f32 output block."""

    def kernel(x_ref, y_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _init():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    def matmul(x, y):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
            grid=(m // bm, n // bn, k // bk),
            in_specs=[
                pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            ],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            interpret=True,
        )(x, y)

    return matmul


def make_attention(
    pl: Any, *, batch: int, heads: int, seq: int, head_dim: int, block_q: int, block_k: int
) -> Callable:
    """Causal flash-attention forward over (batch, heads, seq, head_dim) arrays."""
    sm_scale = 1.0 / math.sqrt(head_dim)
    mask_value = -0.7 * float(np.finfo(np.float32).max)

    def kernel(q_ref, k_ref, v_ref, o_ref):
        qi = pl.program_id(2)
        q = q_ref[...] * sm_scale  # (block_q, head_dim), stays resident across the loop

        def body(j, carry):
            acc, m_prev, l_prev = carry
            k = k_ref[pl.ds(j * block_k, block_k), :]
            v = v_ref[pl.ds(j * block_k, block_k), :]
            s = jnp.dot(q, k.T, preferred_element_type=jnp.float32)  # (block_q, block_k)
            q_pos = qi * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            k_pos = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(q_pos >= k_pos, s, mask_value)
            m_next = jnp.maximum(m_prev, s.max(axis=-1))
            correction = jnp.exp(m_prev - m_next)
            p = jnp.exp(s - m_next[:, None])
            l_next = correction * l_prev + p.sum(axis=-1)
            acc = correction[:, None] * acc + jnp.dot(
                p.astype(v.dtype), v, preferred_element_type=jnp.float32
            )
            return acc, m_next, l_next

        # Number of kv blocks that intersect the causal triangle of this q block.
        num_kv = lax.div((qi + 1) * block_q + block_k - 1, block_k)
        init = (
            jnp.zeros((block_q, head_dim), jnp.float32),
            jnp.full((block_q,), -jnp.inf, jnp.float32),
            jnp.zeros((block_q,), jnp.float32),
        )
        acc, _, l_final = lax.fori_loop(0, num_kv, body, init)
        o_ref[...] = (acc / l_final[:, None]).astype(o_ref.dtype)

    def attention(q, k, v):
        q_spec = pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i: (b, h, i, 0))
        kv_spec = pl.BlockSpec((None, None, seq, head_dim), lambda b, h, i: (b, h, 0, 0))
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid=(batch, heads, seq // block_q),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
            interpret=True,
        )(q, k, v)

    return attention


def make_elementwise(pl: Any, *, rows: int, cols: int, br: int, bc: int) -> Callable:
    """``sin(x) * 2 + tanh(y)`` over a 2-D grid of blocks."""

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...]) * 2.0 + jnp.tanh(y_ref[...])

    def elementwise(x, y):
        spec = pl.BlockSpec((br, bc), lambda i, j: (i, j))
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
            grid=(rows // br, cols // bc),
            in_specs=[spec, spec],
            out_specs=spec,
            interpret=True,
        )(x, y)

    return elementwise


# --------------------------------------------------------------------------------------
# Plain-JAX references.
# --------------------------------------------------------------------------------------


def matmul_reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def attention_reference(q, k, v):
    seq, head_dim = q.shape[-2:]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    s = jnp.where(causal, s, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def elementwise_reference(x, y):
    return jnp.sin(x) * 2.0 + jnp.tanh(y)


# --------------------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    label: str
    make: Callable[[Any], Callable]  # pl module -> kernel-calling function
    reference: Callable
    inputs: Callable[[], tuple]
    rtol: float
    atol: float


def _normal(seed: int, *shapes):
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    return tuple(jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes))


def build_cases(small: bool) -> list[Case]:
    if small:
        mm = {"m": 256, "n": 256, "k": 256, "bm": 64, "bn": 64, "bk": 64}
        at = {"batch": 1, "heads": 2, "seq": 256, "head_dim": 64, "block_q": 64, "block_k": 64}
        ew = {"rows": 1024, "cols": 1024, "br": 256, "bc": 256}
    else:
        mm = {"m": 1024, "n": 1024, "k": 1024, "bm": 128, "bn": 128, "bk": 128}
        at = {"batch": 1, "heads": 4, "seq": 2048, "head_dim": 128, "block_q": 128, "block_k": 128}
        ew = {"rows": 4096, "cols": 4096, "br": 512, "bc": 512}
    qkv_shape = (at["batch"], at["heads"], at["seq"], at["head_dim"])
    return [
        Case(
            name="matmul",
            label="matmul {m}x{k} @ {k}x{n}, blocks {bm}x{bn}x{bk}".format(**mm),
            make=functools.partial(make_matmul, **mm),
            reference=matmul_reference,
            inputs=lambda: _normal(0, (mm["m"], mm["k"]), (mm["k"], mm["n"])),
            rtol=1e-4,
            atol=1e-3,
        ),
        Case(
            name="attention",
            label=(
                "causal flash attn b{batch} h{heads} s{seq} d{head_dim}, blocks {block_q}x{block_k}"
            ).format(**at),
            make=functools.partial(make_attention, **at),
            reference=attention_reference,
            inputs=lambda: _normal(1, qkv_shape, qkv_shape, qkv_shape),
            rtol=1e-3,
            atol=1e-4,
        ),
        Case(
            name="elementwise",
            label="sin(x)*2+tanh(y) {rows}x{cols}, blocks {br}x{bc}".format(**ew),
            make=functools.partial(make_elementwise, **ew),
            reference=elementwise_reference,
            inputs=lambda: _normal(2, (ew["rows"], ew["cols"]), (ew["rows"], ew["cols"])),
            rtol=1e-5,
            atol=1e-5,
        ),
    ]


CASE_NAMES = ("matmul", "attention", "elementwise")

# --------------------------------------------------------------------------------------
# Timing.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Measurement:
    median_s: float | None = None
    runs: int = 0
    ok: bool = True  # result matches the reference
    max_err: float = 0.0
    error: str | None = None  # exception raised while tracing or running


def measure(fn: Callable, args: tuple, repeats: int, budget_s: float) -> tuple[Measurement, Any]:
    """Jit ``fn``, warm it up, then time up to ``repeats`` runs and return the median.

    Timing stops early (after at least one run) once the timed runs exceed ``budget_s``
    seconds in total, so a very slow implementation costs one or two runs, not ``repeats``.
    """
    jitted = jax.jit(fn)
    out = jax.block_until_ready(jitted(*args))  # compile + first run, not timed
    times: list[float] = []
    while len(times) < repeats:
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        times.append(time.perf_counter() - start)
        if sum(times) > budget_s:
            break
    return Measurement(median_s=statistics.median(times), runs=len(times)), out


def run_one(
    fn: Callable, args: tuple, expected: Any, case: Case, repeats: int, budget_s: float
) -> Measurement:
    try:
        m, out = measure(fn, args, repeats, budget_s)
    except Exception as e:  # noqa: BLE001 - report any failure in the table and go on
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
        return Measurement(error=msg[:200])
    out, expected = np.asarray(out), np.asarray(expected)
    m.max_err = float(np.max(np.abs(out - expected)))
    m.ok = out.shape == expected.shape and bool(
        np.allclose(out, expected, rtol=case.rtol, atol=case.atol)
    )
    return m


# --------------------------------------------------------------------------------------
# Reporting.
# --------------------------------------------------------------------------------------


def _ms(m: Measurement | None) -> str:
    if m is None:
        return "n/a"
    if m.error is not None:
        return "error"
    return f"{m.median_s * 1e3:.1f}" + ("" if m.ok else " ✗")


def _ratio(num: Measurement | None, den: Measurement | None) -> str:
    if num is None or den is None or num.median_s is None or den.median_s is None:
        return "n/a"
    return f"{num.median_s / den.median_s:.2f}x"


def run_case(
    case: Case, impls: dict[str, Any], repeats: int, budget_s: float, notes: list[str]
) -> tuple[str, ...]:
    """Time plain JAX and every available Pallas implementation of ``case``; one table row."""
    sys.stdout.flush()
    print(f"running {case.name}: {case.label}", file=sys.stderr, flush=True)
    inputs = case.inputs()
    plain, expected = measure(case.reference, inputs, repeats, budget_s)
    results: dict[str, Measurement | None] = {"ours": None, "upstream": None}
    for impl_name, module in impls.items():
        start = time.perf_counter()
        m = run_one(case.make(module), inputs, expected, case, repeats, budget_s)
        results[impl_name] = m
        elapsed = time.perf_counter() - start
        print(f"  {impl_name}: {_ms(m)} ms, {m.runs} runs, {elapsed:.1f}s", file=sys.stderr)
        where = f"{case.name} / {impl_name}"
        if m.error is not None:
            notes.append(f"{where}: {m.error}")
            continue
        if not m.ok:
            notes.append(
                f"{where}: ✗ does not match the reference "
                f"(max abs err {m.max_err:.3g}; rtol {case.rtol}, atol {case.atol})"
            )
        if m.runs < repeats:
            notes.append(
                f"{where}: median of {m.runs} run(s), not {repeats} "
                f"(timed runs exceeded the {budget_s:g}s budget)"
            )
    ours, upstream = results["ours"], results["upstream"]
    return (
        case.label,
        f"{plain.median_s * 1e3:.1f}",
        _ms(upstream),
        _ms(ours),
        _ratio(ours, plain),
        _ratio(upstream, plain),
        _ratio(upstream, ours),
    )


def load_implementations(skip_upstream: bool) -> dict[str, Any]:
    """The Pallas modules to benchmark, keyed "ours" / "upstream"; prints what was found."""
    impls: dict[str, Any] = {}
    try:
        import pallas as ours

        impls["ours"] = ours
        print(f"ours: pallas {getattr(ours, '__version__', '?')} ({ours.__file__})")
    except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
        print(f"ours: unavailable ({type(e).__name__}: {e})")
    if skip_upstream:
        print("upstream: skipped (--skip-upstream)")
    else:
        from jax.experimental import pallas as upl

        impls["upstream"] = upl
        print("upstream: jax.experimental.pallas")
    return impls


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        choices=CASE_NAMES,
        action="append",
        help="run only this kernel (may be given more than once)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per implementation")
    parser.add_argument(
        "--skip-upstream",
        action="store_true",
        help="do not run upstream Pallas (jax.experimental.pallas)",
    )
    parser.add_argument("--small", action="store_true", help="small sizes for a smoke run")
    parser.add_argument(
        "--budget",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="stop timing an implementation once its timed runs exceed this many seconds "
        "(at least one run is always made; default 120)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    print(f"# Pallas interpreter benchmark{' (--small)' if args.small else ''}\n")
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, repeats {args.repeats}, "
        f"budget {args.budget:g}s per implementation\n"
    )
    impls = load_implementations(args.skip_upstream)
    print()

    cases = [c for c in build_cases(args.small) if not args.only or c.name in args.only]
    notes: list[str] = []
    rows = [run_case(case, impls, args.repeats, args.budget, notes) for case in cases]

    header = (
        "kernel",
        "plain JAX ms",
        "upstream ms",
        "ours ms",
        "ours/plain",
        "upstream/plain",
        "upstream/ours",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if notes:
        print()
        for note in notes:
            print(f"- {note}")
    print(f"\nMedian wall time per call. Total run: {time.perf_counter() - wall_start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
