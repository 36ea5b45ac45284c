"""A pipelined Hopper matmul: TMA copies into swizzled SMEM, ``wgmma`` into a register
accumulator, ``plgpu.emit_pipeline`` over the contraction dim.

    python examples/mosaic_gpu_matmul.py

Runs the kernel in GPU interpret mode on CPU and compares it with ``x @ y``, lowers it to
Mosaic GPU's ``mosaic_gpu_v2`` custom call and, where ptxas and the CUDA plugin are
installed, compiles it for a compile-only sm_90a device and prints what ptxas reports.
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


def swizzled(dtype, swizzle: int = 128) -> tuple:
    """The SMEM layout wgmma reads: tiles of (8, one swizzled row) and the swizzle."""
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

        def with_acc(acc):
            def step(_, x_smem, y_smem):
                plgpu.wgmma(acc, x_smem, y_smem)
                plgpu.wgmma_wait(0)  # the slot is refilled after this step

            plgpu.emit_pipeline(
                step, grid=(k // bk,), max_concurrent_steps=max_concurrent_steps,
                in_specs=[plgpu.BlockSpec((bm, bk), lambda kk: (mi, kk), transforms=transforms),
                          plgpu.BlockSpec((bk, bn), lambda kk: (kk, ni), transforms=transforms)],
            )(x_gmem, y_gmem)
            o_smem[...] = acc[...].astype(o_smem.dtype)

        pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))

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


def report(name, f, *args, target="sm_90a") -> str:
    """Lowers ``f`` for CUDA and, where the toolchain is installed, compiles it."""
    from pallas_mosaic_gpu import compiler

    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu_v2" in text
    try:
        (k,) = compiler.compile(f, *args, target=target)
    except compiler.ToolchainMissingError as e:
        return f"{name}: lowered to mosaic_gpu_v2 (not compiled: {e})"
    return (f"{name}: compiled for {k.target}: {k.registers} registers, "
            f"{k.spill_stores} bytes spilled, {k.smem_bytes} bytes of SMEM, "
            f"wgmma={k.uses_wgmma}, {k.seconds:.2f} s")


def main():
    x, y = inputs()
    got = matmul(x, y, interpret=True)
    want = reference(x, y)
    np.testing.assert_allclose(got.astype(jnp.float32), want.astype(jnp.float32),
                               rtol=2e-2, atol=1e-1)
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    print(f"mosaic_gpu_matmul: interpret matches x @ y (max abs err {err:.3g})")
    print(report("mosaic_gpu_matmul", matmul, x, y))


if __name__ == "__main__":
    main()
