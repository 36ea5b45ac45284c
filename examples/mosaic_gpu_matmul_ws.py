"""A warp-specialised Hopper matmul: one warpgroup issues the TMA copies, another runs
``wgmma`` (``plgpu.emit_pipeline_warp_specialized`` in a ``plgpu.kernel`` of two
warpgroups per block), then stores its tile with a TMA copy.

    python examples/mosaic_gpu_matmul_ws.py

Runs it in GPU interpret mode (the two warpgroups concurrently) against ``x @ y``,
lowers it and, where the toolchain is installed, compiles it for sm_90a.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas as pl  # noqa: E402
import pallas_mosaic_gpu as plgpu  # noqa: E402

try:
    from mosaic_gpu_matmul import inputs, reference, report, swizzled
except ImportError:  # loaded by path (tests)
    import importlib.util
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location(
        "mosaic_gpu_matmul", Path(__file__).with_name("mosaic_gpu_matmul.py"))
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    inputs, reference, report, swizzled = _mod.inputs, _mod.reference, _mod.report, _mod.swizzled


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "max_concurrent_steps",
                                             "interpret"))
def matmul_ws(x, y, *, bm=128, bn=128, bk=64, max_concurrent_steps=2, interpret=False):
    m, k = x.shape
    _, n = y.shape
    transforms = swizzled(x.dtype)

    def kernel(x_gmem, y_gmem, o_gmem, o_smem):
        mi, ni = jax.lax.axis_index("m"), jax.lax.axis_index("n")

        def step(_, x_smem, y_smem, acc):
            plgpu.wgmma(acc, x_smem, y_smem)
            plgpu.wgmma_wait(0)  # the slot is released to the memory warpgroup after this
            return acc

        def compute(eval_pipeline):  # runs on the compute warpgroup only
            def with_acc(acc):
                eval_pipeline(acc)
                o_smem[...] = acc[...].astype(o_smem.dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(mi * bm, bm),
                                                          pl.ds(ni * bn, bn)])
                plgpu.wait_smem_to_gmem(0)

            pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))

        pipeline = plgpu.emit_pipeline_warp_specialized(
            step, grid=(k // bk,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
            max_concurrent_steps=max_concurrent_steps, compute_context=compute,
            in_specs=[plgpu.BlockSpec((bm, bk), lambda kk: (mi, kk), transforms=transforms),
                      plgpu.BlockSpec((bk, bn), lambda kk: (kk, ni), transforms=transforms)])
        pipeline(x_gmem, y_gmem)

    return plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm, n // bn),
        grid_names=("m", "n"), num_threads=2, thread_name="wg",
        scratch_types=[plgpu.SMEM((bm, bn), x.dtype)],
        interpret=plgpu.InterpretParams() if interpret else None,
    )(x, y)


def main():
    x, y = inputs()
    got = matmul_ws(x, y, interpret=True)
    want = reference(x, y)
    np.testing.assert_allclose(got.astype(jnp.float32), want.astype(jnp.float32),
                               rtol=2e-2, atol=1e-1)
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    print(f"mosaic_gpu_matmul_ws: interpret matches x @ y (max abs err {err:.3g})")
    print(report("mosaic_gpu_matmul_ws", matmul_ws, x, y))


if __name__ == "__main__":
    main()
