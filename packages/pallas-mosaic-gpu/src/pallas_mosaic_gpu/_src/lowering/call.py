"""Emits the ``pallas_call`` as Mosaic GPU's custom call (``mosaic_gpu_v2``).

The kernel function built by :func:`kernel.build` binds Mosaic GPU's own primitive,
whose lowering serialises the module into the custom call's backend config, exactly as
upstream's Pallas does; here it is lowered inline into the caller's module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.interpreters import mlir as jmlir

from pallas_mosaic_gpu._src.lowering.kernel import build


def _plain(a):
    if isinstance(a, jax.core.ShapedArray):
        return jax.core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
    return a


def lower_pallas_call(ctx, *in_nodes, jaxpr, grid_mapping, compiler_params, name):
    """The output MLIR values of the ``mosaic_gpu_v2`` custom call for this kernel."""
    axis_ctx = ctx.module_context.axis_context
    mesh = getattr(axis_ctx, "mesh", None)  # inside jax.shard_map: its device mesh
    kernel = build(jaxpr, grid_mapping, compiler_params, name, jax_mesh=mesh)
    plain = ctx.replace(avals_in=[_plain(a) for a in ctx.avals_in],
                        avals_out=[_plain(a) for a in ctx.avals_out])

    def run(*xs):
        # bool operands travel as int8 (one byte per element, as XLA stores pred).
        xs = [x.astype(s.dtype) if x.dtype != s.dtype else x
              for x, s in zip(xs, kernel.in_shapes)]
        if kernel.sem_words:  # semaphores start at zero at every launch
            outs = kernel.fn(*xs, jnp.zeros((kernel.sem_words,), jnp.int32))[:-1]
        else:
            outs = kernel.fn(*xs)
        return [o.astype(a.dtype) if o.dtype != a.dtype else o
                for o, a in zip(outs, plain.avals_out)]

    return jmlir.lower_fun(run, multiple_results=True)(plain, *in_nodes)
