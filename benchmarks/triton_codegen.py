"""Triton code generation: pallas-triton's kernels against the same kernels written by hand.

Each kernel is written twice:

* **pallas**: in Pallas (``import pallas as pl``), lowered by pallas-triton to
  ``triton.language`` source and compiled with ``pltriton.compile``;
* **hand**: directly in ``triton.language`` (below, in the style of the Triton tutorials),
  compiled with ``triton.compile`` the same way: same target, ``num_warps``,
  ``num_stages`` and pointer-alignment hints (16 bytes, as pallas-triton declares).

Both are compiled for ``sm_90`` (and ``sm_80``) on a CPU-only machine. For every compiled
kernel the script reports registers per thread and spill bytes (from ``ptxas -v``, run
with Triton's own flags on the PTX Triton produced), shared memory (Triton's
``metadata.shared``, what the launch requests) and whether the PTX uses tensor-core
instructions (``mma``/``wgmma``). Target of the issue: no spills, tensor cores used,
registers and shared memory within 10% of the hand-written kernel.

Kernels:

* ``matmul``: 1024x1024x1024, 128x128x32 blocks, 4 warps, 3 stages, f32 accumulation;
  bf16 inputs (bf16 output) and f32 inputs (TF32 ``dot``, f32 output). The Pallas
  kernel has two forms: ``k-grid`` (grid ``(M/bm, N/bn, K/bk)``, an f32 scratch
  accumulator initialised under ``pl.when(k == 0)`` and written out under
  ``pl.when(k == last)``) and ``fori`` (grid ``(M/bm, N/bn)``, a ``lax.fori_loop`` over K
  with the accumulator as carry). Both are compared with one hand kernel.
* ``attention``: causal flash-attention forward, bf16, batch 1, 4 heads, sequence 2048,
  head dim 64 (128x64 blocks, 4 warps) and 128 (128x64 blocks, 8 warps), 3 stages; grid
  (batch, heads, q blocks), one loop over the kv blocks up to the causal limit with an
  online softmax (``exp``), the causal mask applied with a ``where`` in every iteration.
  The hand kernel implements the same algorithm (not the tutorial's two-stage split).

Run from the repository root::

    python benchmarks/triton_codegen.py                    # sm_90 and sm_80
    python benchmarks/triton_codegen.py --target 90        # sm_90 only
    python benchmarks/triton_codegen.py --only attention --show-source

Progress goes to stderr, the Markdown table to stdout.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no CUDA plugin noise on a CPU machine

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from jax import lax  # noqa: E402

import pallas as pl  # noqa: E402
import pallas_triton as pltriton  # noqa: E402

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

# --------------------------------------------------------------------------------------
# Pallas kernels.
# --------------------------------------------------------------------------------------


def pallas_matmul_k_grid(*, m, n, k, bm, bn, bk, in_dtype, out_dtype, num_warps,
                         num_stages, cc):
    """Matmul with K as a grid axis and an f32 scratch accumulator."""

    def kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _done():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    f = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pl.ANY((bm, bn), jnp.float32)],
        compiler_params=pltriton.CompilerParams(
            num_warps=num_warps, num_stages=num_stages, compute_capability=cc),
    )
    args = (jax.ShapeDtypeStruct((m, k), in_dtype), jax.ShapeDtypeStruct((k, n), in_dtype))
    return f, args


def pallas_matmul_fori(*, m, n, k, bm, bn, bk, in_dtype, out_dtype, num_warps, num_stages,
                       cc):
    """Matmul over (M/bm, N/bn) programs, a ``fori_loop`` over K inside each."""

    def kernel(x_ref, y_ref, o_ref):
        def body(kk, acc):
            x = x_ref[:, pl.ds(kk * bk, bk)]
            y = y_ref[pl.ds(kk * bk, bk), :]
            return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

        acc = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
        o_ref[...] = acc.astype(o_ref.dtype)

    f = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        compiler_params=pltriton.CompilerParams(
            num_warps=num_warps, num_stages=num_stages, compute_capability=cc),
    )
    args = (jax.ShapeDtypeStruct((m, k), in_dtype), jax.ShapeDtypeStruct((k, n), in_dtype))
    return f, args


def pallas_attention(*, batch, heads, seq, head_dim, block_q, block_k, num_warps,
                     num_stages, cc):
    """Causal flash-attention forward over (batch, heads, seq, head_dim) bf16 arrays."""
    sm_scale = 1.0 / math.sqrt(head_dim)

    def kernel(q_ref, k_ref, v_ref, o_ref):
        qi = pl.program_id(2)
        q = q_ref[...]  # (block_q, head_dim), resident across the loop

        def body(j, carry):
            acc, m_prev, l_prev = carry
            k = k_ref[pl.ds(j * block_k, block_k), :]
            v = v_ref[pl.ds(j * block_k, block_k), :]
            s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * sm_scale
            q_pos = qi * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            k_pos = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(q_pos >= k_pos, s, MASK_VALUE)
            m_next = jnp.maximum(m_prev, s.max(axis=-1))
            correction = jnp.exp(m_prev - m_next)
            p = jnp.exp(s - m_next[:, None])
            l_next = correction * l_prev + p.sum(axis=-1)
            acc = correction[:, None] * acc + jnp.dot(
                p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            return acc, m_next, l_next

        num_kv = lax.div((qi + 1) * block_q + block_k - 1, block_k)
        init = (jnp.zeros((block_q, head_dim), jnp.float32),
                jnp.full((block_q,), -jnp.inf, jnp.float32),
                jnp.zeros((block_q,), jnp.float32))
        acc, _, l_final = lax.fori_loop(0, num_kv, body, init)
        o_ref[...] = (acc / l_final[:, None]).astype(o_ref.dtype)

    shape = (batch, heads, seq, head_dim)
    q_spec = pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, seq, head_dim), lambda b, h, i: (b, h, 0, 0))
    f = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(shape, jnp.bfloat16),
        grid=(batch, heads, seq // block_q),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        compiler_params=pltriton.CompilerParams(
            num_warps=num_warps, num_stages=num_stages, compute_capability=cc),
    )
    args = (jax.ShapeDtypeStruct(shape, jnp.bfloat16),) * 3
    return f, args


# --------------------------------------------------------------------------------------
# The same kernels written by hand in triton.language. Sizes and strides are constexprs:
# pallas-triton bakes them into the generated kernel too, so both see the same facts.
# --------------------------------------------------------------------------------------


@triton.jit
def hand_matmul(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K // BK):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        acc += tl.dot(a, b)
        a_ptrs += BK
        b_ptrs += BK * N
    c_ptrs = c_ptr + rm[:, None] * N + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))


@triton.jit
def hand_attention(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale: tl.constexpr, H: tl.constexpr,
                   SEQ: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr,
                   BLOCK_K: tl.constexpr, MASK: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    qi = tl.program_id(2)
    base = (b * H + h) * SEQ * D
    offs_q = qi * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + base + offs_q[:, None] * D + offs_d[None, :])
    k_ptrs = k_ptr + base + offs_k[None, :] * D + offs_d[:, None]  # K^T block (D, BLOCK_K)
    v_ptrs = v_ptr + base + offs_k[:, None] * D + offs_d[None, :]
    acc = tl.zeros((BLOCK_Q, D), dtype=tl.float32)
    m_i = tl.full((BLOCK_Q,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    hi = ((qi + 1) * BLOCK_Q + BLOCK_K - 1) // BLOCK_K
    for j in range(0, hi):
        kt = tl.load(k_ptrs + j * BLOCK_K * D)
        s = tl.dot(q, kt) * sm_scale
        causal = offs_q[:, None] >= (j * BLOCK_K + offs_k)[None, :]
        s = tl.where(causal, s, MASK)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + j * BLOCK_K * D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_q[:, None] * D + offs_d[None, :], acc.to(o_ptr.dtype.element_ty))


_TL = {jnp.bfloat16: "bf16", jnp.float32: "fp32"}


def _compile_hand(fn, pointers: dict, constexprs: dict, *, num_warps, num_stages, cc):
    """PTX for a compute capability; for an AMD arch (``"gfx942"``), Triton's whole
    ``asm`` dict (AMDGCN and hsaco)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    amd = isinstance(cc, str)
    target = (GPUTarget("hip", cc, pltriton.amd_target(cc).warp_size) if amd
              else GPUTarget("cuda", cc, 32))
    signature = {**pointers, **{name: "constexpr" for name in constexprs}}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers))}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
        k = triton.compile(src, target=target,
                           options={"num_warps": num_warps, "num_stages": num_stages})
    return (k.asm if amd else k.asm["ptx"]), int(k.metadata.shared), k.metadata.name


def _compile_pallas(f, args, cc):
    (k,) = pltriton.compile(f, *args, compute_capability=cc)
    return (k.asm if isinstance(cc, str) else k.ptx), k.shared_mem_bytes, k.name


# --------------------------------------------------------------------------------------
# Measurements.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    kernel: str
    variant: str
    cc: int
    regs: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    smem: int | None = None
    mma: str | None = None
    seconds: float = 0.0
    error: str | None = None


def ptxas_usage(ptx: str, cc: int) -> dict:
    """Registers, spills and stack from ``ptxas -v`` with Triton's own flags."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    arch = sm_arch_from_capability(cc)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        cmd = [get_ptxas(cc).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
               f"--gpu-name={arch}", path, "-o", os.path.join(tmp, "k.o")]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr

    def num(pattern):
        hit = re.search(pattern, log)
        return int(hit.group(1)) if hit else 0

    return {"regs": num(r"Used (\d+) registers"),
            "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"),
            "stack": num(r"(\d+) bytes stack frame")}


def tensor_cores(ptx: str) -> str:
    if re.search(r"\bwgmma\.mma_async", ptx):
        return "wgmma"
    if re.search(r"\bmma\.sync", ptx):
        return "mma.sync"
    return "no"


def measure(kernel: str, variant: str, cc: int, build: Callable[[], tuple]) -> Result:
    res = Result(kernel, variant, cc)
    t0 = time.perf_counter()
    try:
        ptx, smem, _ = build()
        res.smem = smem
        res.mma = tensor_cores(ptx)
        res.__dict__.update(ptxas_usage(ptx, cc))
    except Exception as e:  # noqa: BLE001 - reported in the table
        res.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
    res.seconds = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    group: str
    pallas: dict  # variant label -> builder(cc) of (f, args)
    hand: Callable[[int], tuple]  # cc -> (ptx, smem, name)


def build_cases(show_source: bool) -> list[Case]:
    cases = []
    for in_dtype, out_dtype in ((jnp.bfloat16, jnp.bfloat16), (jnp.float32, jnp.float32)):
        kw = dict(m=1024, n=1024, k=1024, bm=128, bn=128, bk=32, in_dtype=in_dtype,
                  out_dtype=out_dtype, num_warps=4, num_stages=3)
        name = f"matmul {_TL[in_dtype]}"

        def hand(cc, kw=kw):
            ptrs = {"a_ptr": f"*{_TL[kw['in_dtype']]}", "b_ptr": f"*{_TL[kw['in_dtype']]}",
                    "c_ptr": f"*{_TL[kw['out_dtype']]}"}
            consts = {"M": kw["m"], "N": kw["n"], "K": kw["k"], "BM": kw["bm"],
                      "BN": kw["bn"], "BK": kw["bk"]}
            return _compile_hand(hand_matmul, ptrs, consts, num_warps=kw["num_warps"],
                                 num_stages=kw["num_stages"], cc=cc)

        cases.append(Case(name, "matmul", {
            "pallas k-grid": lambda cc, kw=kw: pallas_matmul_k_grid(**kw, cc=cc),
            "pallas fori": lambda cc, kw=kw: pallas_matmul_fori(**kw, cc=cc),
        }, hand))

    for head_dim, block_q, block_k, num_warps in ((64, 128, 64, 4), (128, 128, 64, 8)):
        kw = dict(batch=1, heads=4, seq=2048, head_dim=head_dim, block_q=block_q,
                  block_k=block_k, num_warps=num_warps, num_stages=3)

        def hand(cc, kw=kw):
            ptrs = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16"}
            consts = {"sm_scale": 1.0 / math.sqrt(kw["head_dim"]), "H": kw["heads"],
                      "SEQ": kw["seq"], "D": kw["head_dim"], "BLOCK_Q": kw["block_q"],
                      "BLOCK_K": kw["block_k"], "MASK": MASK_VALUE}
            return _compile_hand(hand_attention, ptrs, consts, num_warps=kw["num_warps"],
                                 num_stages=kw["num_stages"], cc=cc)

        cases.append(Case(f"attention d{head_dim} {block_q}x{block_k} w{num_warps}", "attention",
                          {"pallas": lambda cc, kw=kw: pallas_attention(**kw, cc=cc)}, hand))

    if show_source:
        for case in cases:
            for label, make in case.pallas.items():
                f, args = make(90)
                print(f"# --- {case.name}, {label} ---\n{pltriton.inspect(f, *args)}",
                      file=sys.stderr)
    return cases


# --------------------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------------------


def _ratio(a, b) -> str:
    if a is None or b is None or not b:
        return "–"
    return f"{a / b:.2f}"


def _verdict(p: Result, h: Result) -> str:
    if p.error or h.error:
        return "–"
    misses = []
    if p.spill_stores or p.spill_loads:
        misses.append("spills")
    if p.mma == "no":
        misses.append("no tensor cores")
    if h.regs and abs(p.regs / h.regs - 1) > 0.10:
        misses.append("regs")
    if h.smem and abs(p.smem / h.smem - 1) > 0.10:
        misses.append("smem")
    elif not h.smem and p.smem:
        misses.append("smem")
    return "✓" if not misses else "✗ " + ", ".join(misses)


def report(results: list[tuple[Case, int, Result, list[Result]]], elapsed: float) -> str:
    lines = [
        "| kernel | variant | target | regs | spills (st/ld bytes) | smem bytes "
        "| tensor cores | regs pallas/hand | smem pallas/hand | target met |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    errors = []
    for _case, cc, hand, pallas in results:
        for r in [*pallas, hand]:
            if r.error:
                errors.append(f"- {r.kernel}, {r.variant}, sm_{r.cc}: {r.error}")
                lines.append(f"| {r.kernel} | {r.variant} | sm_{cc} | error | | | | | | |")
                continue
            is_hand = r is hand
            lines.append(
                f"| {r.kernel} | {r.variant} | sm_{cc} | {r.regs} | "
                f"{r.spill_stores}/{r.spill_loads} | {r.smem} | {r.mma} | "
                f"{'' if is_hand else _ratio(r.regs, hand.regs)} | "
                f"{'' if is_hand else _ratio(r.smem, hand.smem)} | "
                f"{'' if is_hand else _verdict(r, hand)} |")
    lines.append("")
    lines.append(f"triton {triton.__version__}, jax {jax.__version__}; compiled on CPU in "
                 f"{elapsed:.0f} s. Target met: no spills, tensor cores, regs and smem "
                 "within 10% of the hand-written kernel.")
    if errors:
        lines += ["", "Errors:", *errors]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append",
                        help="compute capability (90, 80) or AMD arch (gfx942, gfx90a, "
                             "gfx950, gfx1100); repeatable; default 90, 80 and gfx942")
    parser.add_argument("--only", action="append", choices=["matmul", "attention"],
                        help="kernel group (repeatable; default all)")
    parser.add_argument("--show-source", action="store_true",
                        help="print pallas-triton's generated source to stderr")
    opts = parser.parse_args(argv)
    targets = [t if t.startswith("gfx") else int(t) for t in opts.target or
               ["90", "80", "gfx942"]]

    t0 = time.perf_counter()
    cases = [c for c in build_cases(opts.show_source)
             if not opts.only or c.group in opts.only]
    results, amd_results = [], []
    for cc in targets:
        if isinstance(cc, str):
            amd_results += _measure_amd(cases, cc)
            continue
        for case in cases:
            print(f"sm_{cc} {case.name}: hand", file=sys.stderr, flush=True)
            hand = measure(case.name, "hand", cc, lambda case=case, cc=cc: case.hand(cc))
            pallas = []
            for label, make in case.pallas.items():
                print(f"sm_{cc} {case.name}: {label}", file=sys.stderr, flush=True)
                pallas.append(measure(case.name, label, cc,
                                      lambda make=make, cc=cc: _compile_pallas(*make(cc), cc)))
            results.append((case, cc, hand, pallas))
    if results:
        print(report(results, time.perf_counter() - t0))
    if amd_results:
        import triton_codegen_amd

        print()
        print(triton_codegen_amd.report(amd_results))
        print(f"\nAMD rows: triton {triton.__version__}; compiled on CPU, "
              f"{time.perf_counter() - t0:.0f} s in all.")
    return 0


def _measure_amd(cases, arch: str) -> list:
    """The AMD rows (see ``triton_codegen_amd.py``): the same cases for ``arch``; the
    Pallas kernels are built without a compute capability and compiled for ``arch``."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import triton_codegen_amd as amd

    out = []
    for case in cases:
        print(f"{arch} {case.name}: hand", file=sys.stderr, flush=True)
        hand = amd.measure(case.name, "hand", arch, lambda case=case: case.hand(arch))
        pallas = []
        for label, make in case.pallas.items():
            print(f"{arch} {case.name}: {label}", file=sys.stderr, flush=True)
            pallas.append(amd.measure(case.name, label, arch,
                                      lambda make=make: _compile_pallas(*make(None), arch)))
        out.append((case.name, hand, pallas))
    return out


if __name__ == "__main__":
    sys.exit(main())
