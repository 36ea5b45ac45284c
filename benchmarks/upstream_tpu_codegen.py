"""Code generation for upstream's TPU kernels (``jax.experimental.pallas.ops.tpu``) and the
kernels of upstream's TPU tutorials, lowered by upstream and by us, compiled by the same
real TPU compiler (libtpu, deviceless) for v5e and v6e: VMEM bytes XLA allocated and the
final LLO's op mix (vector loads, stores, MXU ops, DMAs, scalar ops, total).

Each side runs in its own process (ours loads upstream's modules through the shim of
``upstream_ops.py``, which blocks upstream's implementation). Every ``pallas_call`` of a
case is compiled alone: ours with ``pallas_tpu.compile``, upstream's exported for ``tpu``
(its own lowering) and compiled with ``pallas_tpu.compiler.compile_exported``, so both
sides' figures come from the same compiler child and the same parser. The all-gather
(remote DMAs, ``lax.axis_index``: it lowers only under ``shard_map``) is exported whole
by both sides and compiled on 4 devices of the chip. Upstream's side traces and lowers
with a deviceless device of the chip as JAX's default device, as on a TPU host (its
kernels and lowering read the chip from it). The figures are static (one compile each;
an op inside a loop counts once). Run from the repository root::

    python benchmarks/upstream_tpu_codegen.py [-k flash] [--chip v5e] [--dump DIR]

``--dump DIR`` writes each kernel's post-layout Mosaic module and final LLO per side, to
diff. Progress goes to stderr, the Markdown tables to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHIPS = ("v5e", "v6e")
MIX = ("vector_load", "vector_store", "mxu", "dma", "scalar")
SHORT = {"vector_load": "vld", "vector_store": "vst", "mxu": "MXU", "dma": "DMA",
         "scalar": "scalar"}


# ------------------------------------------------------------------------------------
# The tutorial kernels of upstream's TPU docs ("Pipelining", "Matrix multiplication",
# "Scalar prefetch and block-sparse computation"), written here after the docs' prose,
# as functions of whatever ``jax.experimental.pallas`` is in the process (upstream's, or
# ours under the shim).


def _pl():
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    return pl, pltpu


def tut_add(shape):
    """Pipelining: two f32 matrices added block by block over a 2-D grid."""
    import jax
    import jax.numpy as jnp

    pl, _ = _pl()
    n, b = shape

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    spec = pl.BlockSpec((b, b), lambda i, j: (i, j))

    def f(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(n // b, n // b), in_specs=[spec, spec],
                              out_specs=spec, name="add_matrices")(x, y)

    a = jax.ShapeDtypeStruct((n, n), jnp.float32)
    return f, (a, a)


def tut_sum(shape):
    """Pipelining, reductions: the sum over a leading axis accumulated in the output
    block, initialised at the first step of the innermost (reduction) grid axis."""
    import jax
    import jax.numpy as jnp

    pl, _ = _pl()
    k, n, b = shape

    def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...]

    def f(x):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((n, n), x.dtype),
            grid=(n // b, n // b, k),
            in_specs=[pl.BlockSpec((None, b, b), lambda i, j, r: (r, i, j))],
            out_specs=pl.BlockSpec((b, b), lambda i, j, r: (i, j)), name="sum_leading")(x)

    return f, (jax.ShapeDtypeStruct((k, n, n), jnp.float32),)


def tut_matmul(shape, *, dtype="bfloat16", transpose_rhs=False, activation=None):
    """Matrix multiplication: (m, k) @ (k, n) in (bm, bk, bn) blocks, an f32 scratch
    accumulator over the k axis, written out (through an optional activation) at the
    last k step; ``transpose_rhs``: the rhs given as (n, k)."""
    import jax
    import jax.numpy as jnp

    pl, pltpu = _pl()
    m, k, n, bm, bk, bn = shape
    dt = jnp.dtype(dtype)

    def kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))
        acc_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], dims,
                                            preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            r = acc_ref[...]
            if activation == "relu":
                r = jnp.maximum(r, 0)
            o_ref[...] = r.astype(o_ref.dtype)

    if transpose_rhs:
        y_spec, y_shape = pl.BlockSpec((bn, bk), lambda i, j, r: (j, r)), (n, k)
    else:
        y_spec, y_shape = pl.BlockSpec((bk, bn), lambda i, j, r: (r, j)), (k, n)

    def f(x, y):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((m, n), dt),
            grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, r: (i, r)), y_spec],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, r: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")),
            name="matmul")(x, y)

    return f, (jax.ShapeDtypeStruct((m, k), dt), jax.ShapeDtypeStruct(y_shape, dt))


def tut_block_sparse(shape):
    """Scalar prefetch and block-sparse computation: a block-sparse (m, k) lhs given by
    its nonzero (bm, bk) blocks and their block coordinates (prefetched into SMEM) times
    a dense rhs; the grid runs over the nonzero blocks, the output block is initialised
    when its row of blocks starts and accumulated in place."""
    import jax
    import jax.numpy as jnp

    pl, pltpu = _pl()
    m, k, n, bm, bk, nnz = shape

    def kernel(rows_ref, cols_ref, first_ref, x_ref, y_ref, o_ref):
        b = pl.program_id(1)

        @pl.when(first_ref[b] == 1)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[0], y_ref[...], preferred_element_type=jnp.float32)

    def f(rows, cols, first, blocks, y):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3, grid=(1, nnz),
            in_specs=[pl.BlockSpec((1, bm, bk), lambda j, b, rows, cols, first: (b, 0, 0)),
                      pl.BlockSpec((bk, n), lambda j, b, rows, cols, first: (cols[b], j))],
            out_specs=pl.BlockSpec((bm, n), lambda j, b, rows, cols, first: (rows[b], j)))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
                              grid_spec=spec, name="block_sparse_matmul")(
            rows, cols, first, blocks, y)

    i32 = jax.ShapeDtypeStruct((nnz,), jnp.int32)
    return f, (i32, i32, i32, jax.ShapeDtypeStruct((nnz, bm, bk), jnp.float32),
               jax.ShapeDtypeStruct((k, n), jnp.float32))


def tut_emit_pipeline(shape):
    """Pipelining, nested pipelines: a kernel whose operands stay in HBM
    (``memory_space=ANY``) runs its own pipeline over them with ``emit_pipeline``."""
    import jax
    import jax.numpy as jnp

    pl, pltpu = _pl()
    n, b = shape

    def inner(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    def kernel(x_hbm, y_hbm, o_hbm):
        spec = pl.BlockSpec((b, b), lambda i, j: (i, j))
        pltpu.emit_pipeline(inner, grid=(n // b, n // b), in_specs=[spec, spec],
                            out_specs=[spec])(x_hbm, y_hbm, o_hbm)

    any_spec = pl.BlockSpec(memory_space=pl.ANY)

    def f(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              in_specs=[any_spec, any_spec], out_specs=any_spec,
                              name="hbm_pipeline")(x, y)

    a = jax.ShapeDtypeStruct((n, n), jnp.float32)
    return f, (a, a)


# ------------------------------------------------------------------------------------
# The cases: upstream's kernel library through ``upstream_ops.KERNELS`` (its builders
# give the function and example arguments; its shapes are those of upstream's tests),
# then the tutorials.

LIBRARY = [  # (name in upstream_ops.KERNELS, shape)
    ("tpu/flash_attention", (2, 4, 1024, 128)),
    ("tpu/flash_attention grad", (2, 4, 1024, 128)),
    ("tpu/splash_attention", (4, 1024, 128)),
    ("tpu/splash_attention grad", (4, 1024, 128)),
    ("tpu/paged_attention", (4, 16, 2, 16, 32, 128)),
    ("tpu/ragged_paged_attention", (8, 2, 128, 16)),
    ("tpu/megablox gmm", (1024, 512, 512, 4)),
    ("tpu/megablox gmm grad", (1024, 512, 512, 4)),
    ("tpu/matmul", (1024, 1024, 1024)),
    ("tpu/all_gather", (32, 128)),
]
TUTORIALS = {
    "tutorial/add_matrices": (tut_add, (2048, 512)),
    "tutorial/sum_leading_axis": (tut_sum, (8, 1024, 512)),
    "tutorial/matmul bf16": (tut_matmul, (1024, 1024, 1024, 512, 512, 512)),
    "tutorial/matmul f32": (lambda s: tut_matmul(s, dtype="float32"),
                            (1024, 1024, 1024, 256, 256, 256)),
    "tutorial/matmul bf16 rhsT relu": (
        lambda s: tut_matmul(s, transpose_rhs=True, activation="relu"),
        (1024, 1024, 1024, 512, 512, 512)),
    "tutorial/block_sparse_matmul": (tut_block_sparse, (1024, 1024, 512, 128, 128, 16)),
    "tutorial/emit_pipeline": (tut_emit_pipeline, (1024, 256)),
}
CASES = [name for name, _ in LIBRARY] + list(TUTORIALS)
# Compiled as one program (its kernel under shard_map, on several devices) by both sides.
WHOLE = {"tpu/all_gather"}


def _build(name: str):
    """``(f, abstract args)`` of a case."""
    import jax

    if name in TUTORIALS:
        build, shape = TUTORIALS[name]
        return build(shape)
    import upstream_ops as U

    shape = dict(LIBRARY)[name]
    fn, args, _, _ = U.KERNELS[name][0](shape)
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
                if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding)
                else jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    return (lambda *a: fn(*a, interpret=False)), abstract


def _pallas_calls(jaxpr) -> list:
    """The ``pallas_call`` equations of a jaxpr, in program order, inner jaxprs too."""
    import jax.extend.core as jex

    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for sub in jex.jaxprs_in_params(eqn.params):
            found.extend(_pallas_calls(getattr(sub, "jaxpr", sub)))
    return found


def _chip_device(chip: str):
    """A deviceless device of ``chip``: upstream's kernels read the default device's
    kind while tracing (``pltpu.get_tpu_info()``), as on a TPU host."""
    from jax.experimental import topologies

    from pallas_tpu import compiler

    return topologies.get_topology_desc(platform="tpu",
                                        topology_name=compiler.TOPOLOGIES[chip]).devices[0]


def _upstream_kernels(f, args, chip: str) -> list:
    """Each ``pallas_call`` of ``f`` lowered by upstream (exported for ``tpu``) and
    compiled by libtpu for ``chip``."""
    import jax

    from pallas_tpu import compiler

    out = []
    with jax.default_device(_chip_device(chip)):  # tracing and lowering read it
        closed = jax.make_jaxpr(f)(*args)
        for eqn in _pallas_calls(closed.jaxpr):
            avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
            prim, params = eqn.primitive, eqn.params
            exported = jax.export.export(
                jax.jit(lambda *a, p=prim, kw=params: p.bind(*a, **kw)),
                platforms=["tpu"])(*avals)
            out.append(compiler.compile_exported(exported, chip=chip, name=_name(params)))
    return out


def _whole_program(f, args, chip: str) -> list:
    """``f`` (one kernel under ``shard_map``) exported whole for ``tpu`` and compiled on
    as many devices of the chip: a kernel with remote DMAs and ``lax.axis_index`` lowers
    only there, by either lowering."""
    import jax

    from pallas_tpu import compiler

    with jax.default_device(_chip_device(chip)):
        exported = jax.export.export(jax.jit(f), platforms=["tpu"])(*args)
    return [compiler.compile_exported(exported, chip=chip, name="program")]


def _name(params) -> str:
    """An upstream ``pallas_call``'s name (``name=``, else its kernel function's)."""
    debug = getattr(params["jaxpr"], "debug_info", None)
    return str(params.get("name") or getattr(debug, "func_name", None) or "kernel")


def _error(e: BaseException) -> str:
    lines = str(e).strip().splitlines() or [""]
    return f"{type(e).__name__}: {lines[0][:300]}"


def worker(side: str, names: list[str], chips: list[str], dump: str | None) -> list:
    if side == "ours":
        import importlib.util

        import upstream_ops as U

        spec = importlib.util.spec_from_file_location("upstream_shim", U.SHIM)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import pallas_tpu

    rows = []
    for name in names:
        for chip in chips:
            t0 = time.perf_counter()
            row = {"case": name, "chip": chip}
            try:
                f, args = _build(name)
                if name in WHOLE:
                    kernels = _whole_program(f, args, chip)
                elif side == "ours":
                    kernels = pallas_tpu.compile(f, *args, chip=chip)
                else:
                    kernels = _upstream_kernels(f, args, chip)
                row["kernels"] = [{"name": k.name, "vmem": k.vmem_bytes,
                                   "mix": k.op_mix()} for k in kernels]
                if dump:
                    for i, k in enumerate(kernels):
                        case = name.replace("/", "_").replace(" ", "_")
                        base = os.path.join(dump, f"{case}-{i}-{chip}-{side}")
                        for ext, text in (("mosaic", k.mosaic), ("llo", k.llo)):
                            with open(f"{base}.{ext}.mlir", "w") as fh:
                                fh.write(text)
            except Exception as e:  # noqa: BLE001 - reported in the table
                row["error"] = _error(e)
            print(f"[{side}] {name} {chip}: {time.perf_counter() - t0:.1f} s "
                  f"{row.get('error', '')}", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def _spawn(side: str, names: list[str], chips: list[str], dump: str | None):
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    # upstream's all-gather runs in shard_map over 4 (simulated CPU) devices.
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=4").strip()
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side,
           "--cases", json.dumps(names), "--chips", json.dumps(chips)]
    if dump:
        cmd += ["--dump", dump]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)


def _collect(proc) -> list:
    out, _ = proc.communicate()
    for line in reversed(out.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    return []


def _ratio(o: int, u: int) -> str:
    if u == 0:
        return "-" if o == 0 else f"+{o}"
    return f"{o / u:.2f}"


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def _table(cases: list[str], chips: list[str], res: dict) -> list[str]:
    lines = ["| kernel | chip | VMEM upstream | VMEM ours | LLO total upstream | "
             "LLO total ours | total ours/up | "
             + " | ".join(f"{SHORT[k]} ours/up" for k in MIX) + " |",
             "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(MIX)]
    mixes = ["", "| kernel | chip | " + " | ".join(f"{SHORT[k]} up / ours" for k in MIX)
             + " |", "|---|---|" + "---:|" * len(MIX)]
    for name in cases:
        for chip in chips:
            u, o = res["upstream"].get((name, chip)), res["ours"].get((name, chip))
            if u is None or o is None:
                lines.append(f"| {name} | {chip} | not run |")
                continue
            if "error" in u or "error" in o:
                lines.append(f"| {name} | {chip} | "
                             f"upstream: {_cell(u.get('error', 'ok'))}; "
                             f"ours: {_cell(o.get('error', 'ok'))} |")
                continue
            uk, ok = u["kernels"], o["kernels"]
            if len(uk) != len(ok):
                lines.append(f"| {name} | {chip} | {len(uk)} kernels upstream, "
                             f"{len(ok)} ours |")
                continue
            for i, (a, b) in enumerate(zip(uk, ok)):
                label = name if len(uk) == 1 else f"{name} [{i}] {a['name']}"
                ma, mb = a["mix"], b["mix"]
                lines.append(
                    f"| {label} | {chip} | {a['vmem']} | {b['vmem']} | {ma['total']} | "
                    f"{mb['total']} | {_ratio(mb['total'], ma['total'])} | "
                    + " | ".join(_ratio(mb[k], ma[k]) for k in MIX) + " |")
                mixes.append(f"| {label} | {chip} | "
                             + " | ".join(f"{ma[k]} / {mb[k]}" for k in MIX) + " |")
    return lines + mixes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="keyword", help="only cases whose name contains this")
    ap.add_argument("--chip", action="append", choices=CHIPS,
                    help="chips to compile for (default: v5e and v6e)")
    ap.add_argument("--dump", help="write each kernel's post-layout Mosaic and LLO here")
    ap.add_argument("--worker", choices=["ours", "upstream"], help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--chips", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    if a.worker:
        rows = worker(a.worker, json.loads(a.cases), json.loads(a.chips), a.dump)
        print(json.dumps(rows))
        return 0
    cases = [c for c in CASES if not a.keyword or a.keyword in c]
    chips = a.chip or list(CHIPS)
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
    t0 = time.perf_counter()
    procs = {side: _spawn(side, cases, chips, a.dump) for side in ("upstream", "ours")}
    res = {side: {(r["case"], r["chip"]): r for r in _collect(p)}
           for side, p in procs.items()}
    print("\n".join(_table(cases, chips, res)))
    print(f"\n{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
