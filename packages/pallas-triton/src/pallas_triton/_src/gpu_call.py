"""The ``lower`` level for platform ``cuda``: compile, then emit jaxlib's Triton call.

The kernel is compiled to PTX by ``triton.compile`` for the target compute capability
(``CompilerParams.compute_capability``, ``PALLAS_TRITON_COMPUTE_CAPABILITY``, the local
GPU, or 80) and packed, with its launch grid and buffer parameters, into the
``triton_kernel_call`` custom call that jaxlib's CUDA plugin executes. On a machine
without a GPU this needs only ``jax-cuda13-plugin`` installed (``pallas-triton[cuda]``).
"""

from __future__ import annotations

import zlib

from pallas_triton._src import jax_compat as jc
from pallas_triton._src.codegen import TritonLoweringError
from pallas_triton._src.compile import compile_lowered, compute_capability
from pallas_triton._src.kernel_call import emit_kernel_call
from pallas_triton._src.lowering import lower_kernel

CUSTOM_CALL_TARGET = "triton_kernel_call"
_ALIGNMENT = 16  # XLA's device buffers are at least 16-byte aligned


def _library():
    lib = jc.gpu_triton()
    if lib is None:
        raise RuntimeError(
            "Lowering pallas_call with the Triton backend for platform 'cuda' needs "
            "jaxlib's Triton kernel call, which comes with the CUDA plugin: "
            "`pip install jax-cuda13-plugin==0.10.2` (or `pip install pallas-triton[cuda]`)."
        )
    return lib


def kernel_call_config(lowered, compiled, name: str) -> bytes:
    """The serialized, compressed ``TritonKernelCall`` for one launch."""
    lib = _library()
    if compiled.global_scratch_bytes:
        raise TritonLoweringError(
            f"kernel {lowered.name} needs a global scratch buffer, which jaxlib 0.10.2's "
            f"Triton kernel call does not provide (pallas-triton)")
    kernel = lib.TritonKernel(
        compiled.name, compiled.num_warps, 1, compiled.shared_mem_bytes, compiled.ptx,
        compiled.ttir, compiled.compute_capability,
    )
    params = [lib.create_array_parameter(0, _ALIGNMENT) for _ in lowered.params]
    gx, gy, gz = lowered.launch_grid
    call = lib.TritonKernelCall(kernel, gx, gy, gz, params)
    return zlib.compress(call.to_proto(name, b""))


def lower_pallas_call(ctx, *in_nodes, jaxpr, grid_mapping, compiler_params, cost_estimate,
                      name, out_avals):
    lowered = lower_kernel(jaxpr, grid_mapping, compiler_params, name)
    cc = compute_capability(compiler_params)
    if cc < 80:
        raise TritonLoweringError(
            f"the Pallas Triton backend (pallas-triton) targets compute capability 8.0+; "
            f"got {cc}")
    compiled = compile_lowered(lowered, cc)
    config = kernel_call_config(lowered, compiled, lowered.name)
    return emit_kernel_call(ctx, CUSTOM_CALL_TARGET, in_nodes, grid_mapping, out_avals,
                            backend_config=config, api_version=2)
