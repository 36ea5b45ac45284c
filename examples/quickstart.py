"""Pallas quickstart: a few kernels, run on CPU and lowered for every installed backend.

    hatch run demo          # or: python examples/quickstart.py [--no-excerpts]

Each kernel below is written as for upstream Pallas (``jax.experimental.pallas``): only
the import differs, and the ``backend=`` argument of ``pl.pallas_call``, which upstream
does not have. For every kernel the script

1. runs it on the CPU twice, with the reference interpreter (``interpret=True``) and as
   a plain ``pallas_call`` (no ``interpret=True``: on CPU the built-in ``interpret``
   backend runs it, where upstream would raise), and compares both with plain JAX,
   printing the largest error and a check mark;
2. for every installed backend other than ``interpret`` (see
   ``pallas.plugins.list_backends()``) and each accelerator platform it lowers for
   (Triton: ``cuda`` for NVIDIA and ``rocm`` for AMD GPUs), lowers it ahead of time with
   ``jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))``, and, if the
   backend has a ``compile`` level (Triton: PTX and cubin for NVIDIA, AMDGCN and hsaco
   for AMD), compiles each of its ``pallas_call``s with ``backend.compile``. No
   accelerator is needed for either.

The script prints a table, kernel x (interpret, CPU, each backend), where a backend's
cell is ``ok`` (``+ compiled`` when compiled too), ``unsupported`` (the backend raised
``NotImplementedError``) or ``error``; then, per backend, a short excerpt of what
lowering produced for the first kernel (the generated Triton source and the compiled
kernel's registers; the Mosaic module's operations; what ptxas reports for the
Mosaic GPU kernel; the custom call of any other backend). With pallas-tpu-sparsecore installed, it also runs a SparseCore kernel (the
embedding lookup of ``examples/sparsecore_embedding.py``, over the vector subcores) in
the interpreter and lowers it for TPU. It exits non-zero if a CPU result does not match
plain JAX.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import re
import sys
import time

# The demo runs on the CPU. Without this, an installed CUDA plugin on a machine without
# a GPU prints an initialisation error; lowering for "cuda" works either way.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402 - after choosing the platform
import jax.extend.core  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas as pl  # noqa: E402
import pallas.plugins  # noqa: E402
from pallas.plugins import KernelRequest  # noqa: E402

# Every kernel wrapper below takes ``backend`` and ``interpret`` and passes them on to
# ``pl.pallas_call``: ``interpret=True`` runs the interpreter; ``backend="triton"`` (an
# addition to upstream) picks the backend used when the call is lowered.


# ---------------------------------------------------------------------------------------
# 1. Elementwise add over a 2-D grid of (128, 128) blocks.


def add_kernel(x_ref, y_ref, o_ref):
    # Each program instance sees one (128, 128) block of each array.
    o_ref[...] = x_ref[...] + y_ref[...]


def add(x, y, *, block=(128, 128), backend=None, interpret=False):
    bm, bn = block
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))  # program (i, j) gets block (i, j)
    return pl.pallas_call(
        add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(x.shape[0], bm), pl.cdiv(x.shape[1], bn)),
        in_specs=[spec, spec],
        out_specs=spec,
        backend=backend,
        interpret=interpret,
    )(x, y)


# ---------------------------------------------------------------------------------------
# 2. Tiled matmul: a 3-D grid (i, j, k); the output block (i, j) stays the same along k,
#    so the kernel accumulates into it, zeroing it on the first k step.


def matmul_kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def matmul(x, y, *, bm=128, bn=128, bk=128, backend=None, interpret=False):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        backend=backend,
        interpret=interpret,
    )(x, y)


# ---------------------------------------------------------------------------------------
# 3. Row softmax: each program instance owns a block of whole rows. The block is as
#    wide as the next power of two (Triton needs power-of-two blocks), so it may hang
#    over the right edge of the array; the kernel masks those columns out itself. Eight
#    rows of 1024 float32 per block keep the block and the buffers its row reductions
#    read from within a Hopper block's 227 KiB of shared memory (Mosaic GPU).


def softmax_kernel(x_ref, o_ref, *, num_cols):
    x = x_ref[...]
    col = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    x = jnp.where(col < num_cols, x, -jnp.inf)  # padding columns contribute exp(-inf) = 0
    x = x - jnp.max(x, axis=-1, keepdims=True)  # for numerical stability
    e = jnp.exp(x)
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def softmax(x, *, block_rows=8, backend=None, interpret=False):
    rows, cols = x.shape
    spec = pl.BlockSpec((block_rows, pl.next_power_of_2(cols)), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(softmax_kernel, num_cols=cols),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(rows, block_rows),),
        in_specs=[spec],
        out_specs=spec,
        backend=backend,
        interpret=interpret,
    )(x)


# ---------------------------------------------------------------------------------------
# 4. Edge blocks: a (1000, 300) array in (128, 128) blocks. The last block along each
#    axis hangs over the edge of the array: reads there return padding (never rely on
#    its value), and writes there are dropped. Here the padding never reaches the
#    result, because every element of the output depends only on the same element of
#    the input.


def scale_shift_kernel(x_ref, o_ref):
    o_ref[...] = 2.0 * x_ref[...] + 1.0


def scale_shift(x, *, block=(128, 128), backend=None, interpret=False):
    bm, bn = block
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(
        scale_shift_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(x.shape[0], bm), pl.cdiv(x.shape[1], bn)),  # (8, 3)
        in_specs=[spec],
        out_specs=spec,
        backend=backend,
        interpret=interpret,
    )(x)


# ---------------------------------------------------------------------------------------
# The examples: (name, Pallas function, plain-JAX reference, inputs, tolerance).


def examples():
    k1, k2, k3, k4, k5, k6 = jax.random.split(jax.random.key(0), 6)
    normal = functools.partial(jax.random.normal, dtype=jnp.float32)
    return [
        ("add 512x512, 2-D grid", add, jnp.add,
         (normal(k1, (512, 512)), normal(k2, (512, 512))), 0.0),
        ("matmul 256x512 @ 512x384, k-accumulation", matmul,
         lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST),
         (normal(k3, (256, 512)), normal(k4, (512, 384))), 1e-3),
        ("row softmax 256x1000", softmax, functools.partial(jax.nn.softmax, axis=-1),
         (normal(k5, (256, 1000)),), 1e-6),
        ("edge blocks 1000x300 in 128x128", scale_shift, lambda x: 2.0 * x + 1.0,
         (normal(k6, (1000, 300)),), 0.0),
    ]


# ---------------------------------------------------------------------------------------
# Running and lowering.


def run_on_cpu(fn, reference, args, tol, **kw) -> tuple[str, bool]:
    """Runs ``fn`` on the CPU (``kw``: ``interpret=True``, or nothing); compares it with
    ``reference`` and times a second, compiled, run."""
    f = jax.jit(functools.partial(fn, **kw))
    out = jax.block_until_ready(f(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    ms = (time.perf_counter() - t0) * 1e3
    expected = reference(*args)
    err = float(np.max(np.abs(np.asarray(out) - np.asarray(expected))))
    ok = bool(np.isfinite(err)) and err <= tol
    return f"{'✓' if ok else '✗'} err {err:.0e}, {ms:.1f} ms", ok


def first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def pallas_call_eqns(jaxpr) -> list:
    """The ``pallas_call`` equations of a jaxpr, including those in sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is pl.pallas_call_p:
            found.append(eqn)
            continue
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(pallas_call_eqns(sub))
    return found


def compile_calls(f, args, backend, platform) -> None:
    """Compiles every ``pallas_call`` of ``f(*args)`` with the backend's compiler."""
    for eqn in pallas_call_eqns(jax.make_jaxpr(f)(*args).jaxpr):
        options = {"platform": platform} if len(backend.platforms) > 1 else {}
        backend.compile(KernelRequest.from_params(eqn.params, eqn.params["compiler_params"],
                                                  **options))


def platforms_of(backend) -> list[str]:
    """The accelerator platforms a backend lowers for (Triton: cuda and rocm)."""
    return [p for p in backend.platforms if p != "cpu"] or list(backend.platforms[:1])


def try_lower(fn, args, backend, platform) -> tuple[str, str | None]:
    """Lowers (and compiles, if it can) ``fn`` for ``backend`` on ``platform``; returns
    (cell, note)."""
    f = jax.jit(functools.partial(fn, backend=backend.name))
    done = "ok"
    try:
        f.trace(*args).lower(lowering_platforms=(platform,))
        if "compile" in backend.levels:
            compile_calls(f, args, backend, platform)
            done = "ok + compiled"
    except NotImplementedError as e:  # the backend's way of saying "not supported"
        return f"unsupported ({platform})", f"{type(e).__name__}: {first_line(e)}"
    except Exception as e:  # noqa: BLE001 - reported under the table
        return f"error ({platform})", f"{type(e).__name__}: {first_line(e)}"
    return f"{done} ({platform})", None


def excerpt(fn, args, backend) -> list[str]:
    """A few lines that show what ``backend`` generated for ``fn(*args)``."""
    f = functools.partial(fn, backend=backend.name)
    platform = backend.platforms[0]
    if backend.name == "triton":
        import pallas_triton as pltriton

        src = pltriton.inspect(f, *args).splitlines()
        body = [ln for ln in src if ln.strip() and not ln.startswith(("import", "from"))]
        lines = ["generated triton.language source (first lines):"]
        lines += ["    " + ln for ln in body[:8]] + [f"    ... ({len(src)} lines)"]
        for k in pltriton.compile(f, *args):
            u = k.resource_usage()
            lines.append(f"NVIDIA, compiled for sm_{k.compute_capability}: {u['registers']} "
                         f"registers, {k.shared_mem_bytes} B shared memory, {u['local']} B "
                         f"spilled, tensor cores {'yes' if k.uses_tensor_cores() else 'no'}")
        if "rocm" in backend.platforms:
            for k in pltriton.compile(f, *args, compute_capability=pltriton.rocm_arch()):
                u = k.resource_usage()
                lines.append(f"AMD, compiled for {k.arch} (wave{k.warp_size}): {u['vgprs']} "
                             f"VGPRs, {u['sgprs']} SGPRs, {u['lds']} B LDS, {u['scratch']} B "
                             f"scratch, occupancy {u['occupancy']}, MFMA/WMMA "
                             f"{'yes' if k.uses_tensor_cores() else 'no'}")
        return lines
    if backend.name == "mosaic_gpu" and "compile" in backend.levels:
        from pallas_mosaic_gpu import compiler

        lines = []
        for k in compiler.compile(f, *args):
            lines.append(f"compiled for {k.target}: {k.registers} registers, "
                         f"{k.smem_bytes} B shared memory, {k.spill_stores} B spilled, "
                         f"{len(k.ptx.splitlines())} PTX lines, wgmma "
                         f"{'yes' if k.uses_wgmma else 'no'}")
        return lines
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))
    if backend.name == "mosaic_tpu":
        from pallas_tpu import inspect as tpu_inspect

        lines = []
        for m in tpu_inspect.mosaic_modules(lowered):
            ops = collections.Counter(tpu_inspect.op_names(m))
            top = ", ".join(f"{n} x{c}" for n, c in ops.most_common(6))
            lines.append(f"Mosaic module: {sum(ops.values())} operations ({top})")
        return lines
    text = lowered.as_text()
    calls = sorted(set(re.findall(r"custom_call @([\w$.\-]+)", text)))
    return [f"StableHLO for {platform}: {len(text.splitlines())} lines, custom calls: "
            f"{', '.join(calls) or 'none'}"]


def sparsecore_demo() -> bool:
    """With pallas-tpu-sparsecore installed: the embedding lookup of
    ``examples/sparsecore_embedding.py`` (a kernel over the SparseCore vector subcores,
    which the grid kernels above are not) interpreted on CPU and lowered for TPU."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparsecore_embedding.py")
    spec = importlib.util.spec_from_file_location("sparsecore_embedding", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    table, ids, _ = ex.inputs()
    got = ex.embedding_lookup(table, ids, interpret=True)
    err = float(np.max(np.abs(np.asarray(got) - np.asarray(ex.lookup_reference(table, ids)))))
    lowered = jax.jit(ex.embedding_lookup).trace(table, ids).lower(lowering_platforms=("tpu",))
    text = lowered.as_text()
    sc = "DEVICE_TYPE_SPARSECORE" in str(ex.mosaic_backend_configs(lowered))
    print(f"\n[mosaic_sparsecore] embedding lookup {tuple(table.shape)}[{ids.shape[0]} ids] over "
          f"{ex.plsc.get_sparse_core_info().num_cores} SparseCores x "
          f"{ex.plsc.get_sparse_core_info().num_subcores} vector subcores: "
          f"interpret {'✓' if err == 0 else '✗'} err {err:.0e}; lowered for tpu: "
          f"{text.count('tpu_custom_call')} tpu_custom_call"
          f"{' (device type SparseCore)' if sc else ''}")
    return err == 0


def print_table(header, rows):
    """Prints a Markdown table."""
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]

    def line(cells):
        return "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"

    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Runs a few Pallas kernels on CPU and lowers them for every installed "
                    "backend.")
    parser.add_argument("--no-excerpts", action="store_true",
                        help="skip the excerpts of what each backend generated")
    opts = parser.parse_args(argv)  # unknown arguments are an error
    start = time.perf_counter()
    backends = [b for b in pallas.plugins.list_backends() if b.name != "interpret"]
    print(f"pallas {pl.__version__} on jax {jax.__version__}, "
          f"devices: {', '.join(d.platform for d in jax.devices())}")
    print("installed backends: "
          + ", ".join(b.describe() for b in pallas.plugins.list_backends()))
    for name, exc in pallas.plugins.load_failures().items():
        print(f"  plugin {name!r} failed to load: {type(exc).__name__}: {exc}")
    print()

    rows, notes, all_ok = [], {}, True  # notes: (backend, reason) -> kernel names
    for name, fn, reference, args, tol in examples():
        cell, ok = run_on_cpu(fn, reference, args, tol, interpret=True)
        cpu_cell, cpu_ok = run_on_cpu(fn, reference, args, tol)
        all_ok &= ok and cpu_ok
        row = [name, cell, cpu_cell]
        for b in backends:
            for platform in platforms_of(b):
                cell, note = try_lower(fn, args, b, platform)
                row.append(cell)
                if note:
                    notes.setdefault((b.name, note), []).append(name)
        rows.append(row)

    columns = [b.name if len(platforms_of(b)) == 1 else f"{b.name} ({p})"
               for b in backends for p in platforms_of(b)]
    print_table(["kernel", "interpret=True", "on CPU, no interpret=True", *columns], rows)
    if not backends:
        print("\n(no backend plugin is installed besides the interpreter; install e.g. "
              "pallas-triton or pallas-tpu to see kernels lowered for it here)")
    for (backend, reason), kernels in notes.items():
        which = "every kernel" if len(kernels) == len(rows) else "; ".join(kernels)
        print(f"\n{backend} ({which}):\n  {reason}")
    if backends and not opts.no_excerpts:
        name, fn, _, args, _ = examples()[0]
        print(f"\nWhat lowering produced for {name!r}:")
        for b in backends:
            try:
                lines = excerpt(fn, args, b)
            except Exception as e:  # noqa: BLE001 - reported, never fatal
                lines = [f"(no excerpt: {type(e).__name__}: {first_line(e)})"]
            print(f"\n[{b.name}]")
            for ln in lines:
                print(f"  {ln}")
    if any(b.name == "mosaic_sparsecore" for b in backends):
        all_ok &= sparsecore_demo()
    verdict = "CPU results match plain JAX" if all_ok else "MISMATCH against plain JAX"
    print(f"\n{verdict} ({time.perf_counter() - start:.1f}s)")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
