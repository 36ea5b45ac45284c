"""The kernels of the repository's ``examples/`` as bundle benchmarks, each at a size
that measures a GPU, with the example's own plain-JAX reference.

The examples are scripts, not a package: they are loaded from their files (``--examples
DIR``, by default the ``examples/`` folder of the checkout this package is installed
from, when there is one). An example whose kernel needs another GPU generation than the
bundle's target (the Blackwell matmul on sm_90a) is left out, and says so.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_conformance.bench_kernels import Benchmark, Input

F32 = jnp.float32


def default_examples_dir() -> str | None:
    """``examples/`` of the checkout holding this package (an editable install), else
    ``./examples`` when it exists, else None."""
    here = Path(__file__).resolve()
    for parent in list(here.parents)[:5]:
        cand = parent / "examples"
        if (cand / "quickstart.py").is_file():
            return str(cand)
    cand = Path.cwd() / "examples"
    return str(cand) if (cand / "quickstart.py").is_file() else None


def _load(folder: str, name: str):
    path = os.path.join(folder, name + ".py")
    spec = importlib.util.spec_from_file_location(f"_pallas_example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mm_inputs(m, k, n, dtype):
    return (Input((m, k), dtype), Input((k, n), dtype, scale=1 / math.sqrt(k)))


def example_benchmarks(folder: str, backend: str, target: str | None,
                       size: str = "full") -> tuple[list[Benchmark], dict[str, str]]:
    """``(benchmarks, left_out)``: the examples' kernels for ``backend``, and the
    examples left out with the reason."""
    full = size == "full"
    out: list[Benchmark] = []
    left_out: dict[str, str] = {}
    qs = _load(folder, "quickstart")
    kw = dict(interpret=True) if backend == "interpret" else dict(backend=backend)

    n = 4096 if full else 128
    out.append(Benchmark(
        f"examples/quickstart_matmul_bf16_{n}", functools.partial(qs.matmul, **kw),
        lambda x, y: jnp.dot(x, y, preferred_element_type=F32), _mm_inputs(n, n, n, "bfloat16"),
        flops=2.0 * n ** 3, description="examples/quickstart.py matmul: (128, 128, 128) blocks, "
                                        "the f32 output block as accumulator"))
    r, c = (8192, 16384) if full else (128, 256)
    out.append(Benchmark(
        f"examples/quickstart_add_f32_{r}x{c}", functools.partial(qs.add, **kw), jnp.add,
        (Input((r, c), "float32"), Input((r, c), "float32")), bytes=3.0 * r * c * 4,
        tolerance=(1e-6, 1e-6), description="examples/quickstart.py add, (128, 128) blocks"))
    r, c = (16384, 1000) if full else (32, 200)
    out.append(Benchmark(
        f"examples/quickstart_softmax_f32_{r}x{c}", functools.partial(qs.softmax, **kw),
        lambda x: jax.nn.softmax(x, axis=-1), (Input((r, c), "float32", 4.0),),
        bytes=2.0 * r * c * 4, tolerance=(1e-5, 1e-4),
        description="examples/quickstart.py softmax: 8 rows per program, columns padded to "
                    "a power of two and masked"))

    fm = _load(folder, "fused_matmul")
    from pallas import fuser

    # The whole K of both operands is one block: 512 fits Triton's registers, Mosaic GPU
    # holds the f32 blocks and the fused epilogue in a block's 227 KiB of shared memory.
    m, k, nn = (4096, 128 if backend == "mosaic_gpu" else 512, 4096) if full else (128, 128, 128)
    fused = fuser.fuse(lambda x, w, b: fm.model(
        fm.make_fusible_matmul(block=(64, 128), **kw), x, w, b))
    out.append(Benchmark(
        f"examples/fused_matmul_{m}x{k}x{nn}", fused,
        lambda x, w, b: fm.model(lambda a, c: a @ c, x, w, b),
        (Input((m, k), "float32"), Input((k, nn), "float32", scale=1 / 16),
         Input((nn,), "float32")), flops=2.0 * m * k * nn, tolerance=(2e-2, 2e-2),
        description="examples/fused_matmul.py: relu(x)*2 @ w, + bias, tanh, bf16, fused by "
                    "pallas.fuser into one kernel"))

    if backend != "mosaic_gpu":
        return out, left_out

    mg = _load(folder, "mosaic_gpu_matmul")
    n = 4096 if full else 256
    mm_in = _mm_inputs(n, n, n, "float16")
    if target in (None, "sm_90a"):
        out.append(Benchmark(
            f"examples/mosaic_gpu_matmul_f16_{n}", functools.partial(mg.matmul), mg.reference,
            mm_in, flops=2.0 * n ** 3,
            description="examples/mosaic_gpu_matmul.py: TMA + wgmma, emit_pipeline"))
        ws = _load(folder, "mosaic_gpu_matmul_ws")
        out.append(Benchmark(
            f"examples/mosaic_gpu_matmul_ws_f16_{n}", functools.partial(ws.matmul_ws),
            mg.reference, mm_in, flops=2.0 * n ** 3,
            description="examples/mosaic_gpu_matmul_ws.py: warp-specialised wgmma matmul"))
        fa = _load(folder, "mosaic_gpu_flash_attention")
        b, h, s, d = (2, 16, 4096, 64) if full else (1, 2, 256, 64)
        out.append(Benchmark(
            f"examples/mosaic_gpu_flash_attention_f16_{b}x{h}x{s}x{d}", fa.flash_attention,
            fa.reference, tuple(Input((b, h, s, d), "float16") for _ in range(3)),
            flops=4.0 * b * h * s * s * d, tolerance=(3e-2, 3e-2),
            description="examples/mosaic_gpu_flash_attention.py: non-causal, warp-specialised"))
    else:
        for name in ("mosaic_gpu_matmul", "mosaic_gpu_matmul_ws",
                     "mosaic_gpu_flash_attention"):
            left_out[f"examples/{name}"] = f"wgmma is Hopper's (sm_90a); target is {target}"
    if target == "sm_100a":
        bw = _load(folder, "mosaic_gpu_matmul_blackwell")
        out.append(Benchmark(
            f"examples/mosaic_gpu_matmul_blackwell_f16_{n}", functools.partial(bw.matmul),
            bw.reference, mm_in, flops=2.0 * n ** 3,
            description="examples/mosaic_gpu_matmul_blackwell.py: TMA + tcgen05 into TMEM"))
    else:
        left_out["examples/mosaic_gpu_matmul_blackwell"] = (
            f"tcgen05 is Blackwell's (sm_100a); target is {target or 'sm_90a'}")
    return out, left_out
