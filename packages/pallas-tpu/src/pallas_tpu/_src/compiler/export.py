"""One kernel as a ``jax.export`` artifact for platform ``tpu``, the form the compiler
child process receives.

A :class:`pallas.plugins.KernelRequest` carries the kernel but not a function to jit, so
the kernel is bound as a primitive of its own whose lowering is the backend's ``lower``
(``mosaic_tpu`` or ``mosaic_sparsecore``): the artifact holds exactly the
``tpu_custom_call`` that a ``pallas_call`` of the kernel lowers to.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.extend.core as jex
import jax.numpy as jnp
from jax.interpreters import mlir

import pallas.plugins
from pallas.plugins import KernelRequest, LoweringRequest
from pallas_tpu._src import jax_compat
from pallas_tpu._src.lowering.types import is_semaphore as _is_sem

kernel_p = jex.Primitive("pallas_tpu_compiled_kernel")
kernel_p.multiple_results = True


class _Kernel:
    """The request and backend, held by identity (a primitive's params are hashed)."""

    def __init__(self, request: KernelRequest, backend: str):
        self.request, self.backend = request, backend


@kernel_p.def_abstract_eval
def _abstract_eval(*avals, kernel: _Kernel):
    return [jax.core.ShapedArray(a.shape, a.dtype) for a in kernel.request.out_avals]


def _lower(ctx, *nodes, kernel: _Kernel):
    r = kernel.request
    nb = r.grid_mapping.num_dynamic_grid_bounds
    fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(KernelRequest)}
    lowering = LoweringRequest(**fields, ctx=ctx, in_nodes=nodes[nb:], grid_bounds=nodes[:nb])
    return pallas.plugins.get_backend(kernel.backend).lower(lowering)


mlir.register_lowering(kernel_p, _lower, platform="tpu")


def operand_avals(request: KernelRequest) -> list[jax.ShapeDtypeStruct]:
    """The operands of the kernel's ``pallas_call``: the dynamic grid sizes (int32), the
    scalar-prefetch operands, then the inputs."""
    gm = request.grid_mapping
    avals = [jax.ShapeDtypeStruct((), jnp.int32)] * gm.num_dynamic_grid_bounds
    avals += [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in gm.prefetch_avals]
    avals += [jax.ShapeDtypeStruct(bm.array_aval.shape, bm.array_aval.dtype)
              for bm in gm.in_block_mappings]
    return avals


def is_semaphore(space) -> bool:
    return space is not None and _is_sem(space)


def export_kernel(request: KernelRequest, backend: str) -> bytes:
    """The serialised ``jax.export`` artifact of the kernel, lowered for ``tpu`` by
    ``backend`` (our lowering errors are raised here, before the compiler runs)."""
    kernel = _Kernel(request, backend)

    # A semaphore output lives in semaphore memory, which a program cannot return (libtpu
    # aborts): in a real program it flows into the next kernel, so it is not returned.
    keep = [k for k, bm in enumerate(request.grid_mapping.out_block_mappings)
            if not is_semaphore(bm.memory_space)]

    def f(*operands):
        outs = kernel_p.bind(*operands, kernel=kernel)
        return [outs[k] for k in keep]

    avals = operand_avals(request)
    if not avals:
        # A program without parameters is compiled for the host by XLA ("no registered
        # implementation ... tpu_custom_call for Host"): give it one it does not use.
        g = f

        def f(_unused):
            return g()

        avals = [jax.ShapeDtypeStruct((), jnp.int32)]
    with jax_compat.no_mesh():  # one device's program, whatever mesh is in context
        exported = jax.export.export(jax.jit(f), platforms=["tpu"])(*avals)
    return bytes(exported.serialize())
