"""A pipelined Blackwell matmul: TMA copies into swizzled SMEM, ``tcgen05_mma`` into a
TMEM accumulator, ``plgpu.emit_pipeline`` over the contraction dim.

    python examples/mosaic_gpu_matmul_blackwell.py

Runs the kernel in GPU interpret mode on CPU and compares it with ``x @ y``, lowers it to
Mosaic GPU's ``mosaic_gpu_v2`` custom call and, where ptxas and the CUDA plugin are
installed, compiles it for a compile-only sm_100a (B200) device and prints what ptxas
reports (the PTX holds ``tcgen05`` instructions). Mosaic GPU fixes the target per
process, so this script compiles for sm_100a only.
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

TARGET = "sm_100a"


def swizzled(dtype, swizzle: int = 128) -> tuple:
    """The SMEM layout the tensor cores read: tiles of (8, one swizzled row), swizzled."""
    return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
            plgpu.SwizzleTransform(swizzle))


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk", "max_concurrent_steps",
                                             "interpret"))
def matmul(x, y, *, bm=128, bn=128, bk=64, max_concurrent_steps=2, interpret=False):
    m, k = x.shape
    _, n = y.shape
    transforms = swizzled(x.dtype)

    def kernel(x_gmem, y_gmem, o_smem):
        mi, ni = pl.program_id(0), pl.program_id(1)

        def with_tmem(acc_tmem, mma_done):
            def step(idx, x_smem, y_smem):
                (kk,) = idx
                # The first step overwrites the accumulator: TMEM starts uninitialised.
                plgpu.tcgen05_mma(acc_tmem, x_smem, y_smem, mma_done, accumulate=kk > 0)
                plgpu.barrier_wait(mma_done)  # the slot is refilled after this step

            plgpu.emit_pipeline(
                step, grid=(k // bk,), max_concurrent_steps=max_concurrent_steps,
                in_specs=[plgpu.BlockSpec((bm, bk), lambda kk: (mi, kk), transforms=transforms),
                          plgpu.BlockSpec((bk, bn), lambda kk: (kk, ni), transforms=transforms)],
            )(x_gmem, y_gmem)
            o_smem[...] = plgpu.async_load_tmem(acc_tmem).astype(o_smem.dtype)
            plgpu.wait_load_tmem()

        pl.run_scoped(with_tmem, plgpu.TMEM((bm, bn), jnp.float32),
                      plgpu.Barrier(orders_tensor_core=True))

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        backend="mosaic_gpu", interpret=plgpu.InterpretParams() if interpret else False,
    )(x, y)


def inputs(m=256, k=512, n=256, dtype=jnp.float16):
    kx, ky = jax.random.split(jax.random.key(0))
    return (jax.random.normal(kx, (m, k), jnp.float32).astype(dtype),
            jax.random.normal(ky, (k, n), jnp.float32).astype(dtype))


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def report(name, f, *args, target=TARGET) -> str:
    """Lowers ``f`` for CUDA and, where the toolchain is installed, compiles it."""
    from pallas_mosaic_gpu import compiler

    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu_v2" in text
    try:
        (k,) = compiler.compile(f, *args, target=target)
    except compiler.ToolchainMissingError as e:
        return f"{name}: lowered to mosaic_gpu_v2 (not compiled: {e})"
    mix = k.instruction_mix()
    return (f"{name}: compiled for {k.target}: {k.registers} registers, "
            f"{k.spill_stores} bytes spilled, {k.smem_bytes} bytes of SMEM, "
            f"tcgen05={k.uses_tcgen05} ({mix.get('tcgen05', 0)} PTX instructions), "
            f"{k.seconds:.2f} s")


def main():
    x, y = inputs()
    got = matmul(x, y, interpret=True)
    want = reference(x, y)
    np.testing.assert_allclose(got.astype(jnp.float32), want.astype(jnp.float32),
                               rtol=2e-2, atol=1e-1)
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    print(f"mosaic_gpu_matmul_blackwell: interpret matches x @ y (max abs err {err:.3g})")
    os.environ.setdefault("PALLAS_MOSAIC_GPU_TARGET", TARGET)
    print(report("mosaic_gpu_matmul_blackwell", matmul, x, y))


if __name__ == "__main__":
    main()
