"""A TPU matmul in the upstream style: a 3-D grid with an f32 VMEM accumulator.

    python examples/tpu_matmul.py

Runs the kernel in TPU interpret mode on CPU, compares it with ``x @ y``, and lowers it
for TPU (a ``tpu_custom_call`` carrying the Mosaic module), printing the Mosaic ops used.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas as pl  # noqa: E402
import pallas_tpu as pltpu  # noqa: E402


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    # Grid (i, j, k): the output block (i, j) is revisited along k, which is the
    # reduction ("arbitrary") axis; the f32 accumulator lives in VMEM scratch.
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk", "bn", "interpret"))
def matmul(x, y, *, bm=128, bk=128, bn=128, interpret=False):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(x, y)


def inputs(m=256, k=512, n=384, dtype=jnp.bfloat16):
    kx, ky = jax.random.split(jax.random.key(0))
    return (jax.random.normal(kx, (m, k), jnp.float32).astype(dtype),
            jax.random.normal(ky, (k, n), jnp.float32).astype(dtype))


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def main():
    from pallas_tpu.inspect import mosaic_modules, op_names

    x, y = inputs()
    got = matmul(x, y, interpret=True)
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - reference(x, y).astype(jnp.float32))))
    np.testing.assert_allclose(got.astype(jnp.float32), reference(x, y).astype(jnp.float32),
                               rtol=2e-2, atol=2e-1)
    lowered = matmul.trace(x, y).lower(lowering_platforms=("tpu",))
    (module,) = mosaic_modules(lowered)
    print(f"tpu_matmul: interpret matches x @ y (max abs err {err:.3g}); lowered for TPU "
          f"with {sorted(set(op_names(module)) - {'builtin.module'})}")


if __name__ == "__main__":
    main()
