"""Kernel fusion with ``pallas.fuser``: a matmul kernel with its prologue and epilogue fused.

    python examples/fused_matmul.py

``fusible_matmul`` is written once. ``fuser.fuse`` hands it the ``jax.numpy`` code that
produces its operands (here ``relu(x) * 2``) and consumes its result (``tanh(z + bias)``
cast to bfloat16) as *fusions*; the kernel pulls its BlockSpecs back through them
(``fuser.pull_block_spec``) and evaluates them block by block inside its body, so the
whole computation is one ``pallas_call``. The script runs it with the interpreter,
compares with plain JAX, and lowers the same fused function for every installed
backend (Mosaic TPU for ``tpu``, Triton for ``cuda``, ...) without an accelerator.
"""

from __future__ import annotations

import os
import re
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas as pl  # noqa: E402
import pallas.plugins  # noqa: E402
from pallas import fuser  # noqa: E402


def _pulled(fusion, block_spec):
    """A fusion read in blocks of ``block_spec``: (kernel_fn, value block specs, values)."""
    fn, values, _ = fuser.get_fusion_values(fusion)
    kernel_fn, (value_specs,), _ = fuser.pull_block_spec(
        fn, block_spec, grid_len=2,
        scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(values)
    return kernel_fn, value_specs, values


def make_fusible_matmul(block: tuple[int, int] = (128, 128), **pallas_call_kwargs):
    """A fusible ``z_fn(x_fn() @ y_fn())``, tiled in output blocks of at most ``block``
    with the whole K per block; ``pallas_call_kwargs`` go to its ``pallas_call``."""

    @fuser.fusible
    def fusible_matmul(x_fn, y_fn, z_fn):
        (m, k), (_, n) = x_fn.shape, y_fn.shape
        bm, bn = min(m, block[0]), min(n, block[1])
        x_kernel, x_specs, x_values = _pulled(x_fn, pl.BlockSpec((bm, k), lambda i, j: (i, 0)))
        y_kernel, y_specs, y_values = _pulled(y_fn, pl.BlockSpec((k, bn), lambda i, j: (0, j)))
        acc_type = jax.ShapeDtypeStruct((m, n), jnp.float32)
        trivial = z_fn is None
        if trivial:
            z_fn = lambda acc: (acc.astype(x_fn.dtype),)  # noqa: E731
        # The epilogue's output blocks: the accumulator's blocks pushed through it.
        acc_spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
        out_specs = fuser.push_block_spec(z_fn, acc_spec)(acc_type)
        out_shape = jax.eval_shape(z_fn, acc_type)
        z_fn2, z_values, _ = fuser.get_fusion_values(z_fn, acc_type)
        z_kernel, (z_specs, _), _ = fuser.pull_block_spec(
            z_fn2, out_specs, grid_len=2,
            scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(z_values, acc_type)

        def kernel(x_refs, y_refs, z_refs, *o_refs):
            pids = (pl.program_id(0), pl.program_id(1))
            load = lambda refs: jax.tree.map(lambda r: r[...], refs)  # noqa: E731
            x = x_kernel(pids, (), load(x_refs))
            y = y_kernel(pids, (), load(y_refs))
            acc = jnp.dot(x, y, preferred_element_type=jnp.float32)
            for o_ref, out in zip(o_refs, z_kernel(pids, (), load(z_refs), acc)):
                o_ref[...] = out

        out = pl.pallas_call(kernel, out_shape, grid=(m // bm, n // bn),
                             in_specs=[x_specs, y_specs, z_specs], out_specs=out_specs,
                             **pallas_call_kwargs)(x_values, y_values, z_values)
        return out[0] if trivial else out

    return fusible_matmul


def model(matmul, x, w, bias):
    """The computation to fuse: an activation before the matmul, bias/tanh/cast after."""
    z = matmul(jax.nn.relu(x) * 2.0, w)
    return jnp.tanh(z + bias[None, :]).astype(jnp.bfloat16)


def main() -> int:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((256, 128)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((128, 256)), jnp.float32) / 16
    bias = jnp.asarray(rng.standard_normal((256,)), jnp.float32)
    reference = model(lambda a, b: a @ b, x, w, bias)

    fused = fuser.fuse(lambda x, w, b: model(make_fusible_matmul(interpret=True), x, w, b))
    prims = sorted({e.primitive.name for e in jax.make_jaxpr(fused)(x, w, bias).eqns})
    out = jax.jit(fused)(x, w, bias)
    err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - reference.astype(jnp.float32))))
    ok = err < 2e-2
    print(f"interpret: one fused kernel (top-level primitives {prims}), max error {err:.2e} "
          f"{'ok' if ok else 'MISMATCH'}")

    # (64, 128) blocks fit every backend's on-chip memory with their operands double
    # buffered ((128, 128) f32 blocks exceed Mosaic GPU's 227 KiB of shared memory).
    for backend in pallas.plugins.list_backends():
        if backend.name == "interpret":
            continue
        platform = backend.platforms[0]
        fused = fuser.fuse(lambda x, w, b, name=backend.name: model(
            make_fusible_matmul(block=(64, 128), backend=name), x, w, b))
        try:
            lowered = jax.jit(fused).trace(x, w, bias).lower(lowering_platforms=(platform,))
            targets = re.findall(r"custom_call @(\w+)", lowered.as_text())
            print(f"{backend.name} ({platform}): lowered to one kernel, custom calls {targets}")
        except NotImplementedError as e:
            print(f"{backend.name} ({platform}): unsupported: {str(e).splitlines()[0]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
