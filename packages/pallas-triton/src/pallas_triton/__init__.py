"""Pallas on Triton: lowers Pallas kernels to ``triton.language`` for NVIDIA and AMD GPUs.

``import pallas_triton as pltriton`` mirrors upstream ``jax.experimental.pallas.triton``;
``pltriton.inspect(f, *args)`` shows the generated Triton kernel.
"""


from pallas.atomics import (  # upstream's pltriton.atomic_* are pallas-core's atomics
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_xchg,
    atomic_xor,
)
from pallas_triton.__about__ import __version__
from pallas_triton._src import quiet_rocm as _quiet_rocm
from pallas_triton._src.amdgcn import code_object_usage, instruction_mix
from pallas_triton._src.api import (
    CompilerParams,
    PallasCall,
    approx_tanh,
    dot,
    find_pallas_calls,
    inspect,
    load,
    lower,
    max_contiguous,
    store,
)
from pallas_triton._src.codegen import TritonLoweringError
from pallas_triton._src.compile import CompiledKernel, compile_lowered
from pallas_triton._src.compile import compute_capability as _target
from pallas_triton._src.emulate import emulate_lowered
from pallas_triton._src.lowering import LoweredKernel
from pallas_triton._src.primitives import debug_barrier, elementwise_inline_asm
from pallas_triton._src.targets import (
    AMD_TARGETS,
    DEFAULT_ROCM_ARCH,
    AMDTarget,
    amd_target,
    rocm_arch,
)

_quiet_rocm.install()  # before JAX's first backend use, where this import comes first


def compile(f, *args, compute_capability: int | str | None = None,  # noqa: A001
            **kwargs) -> list[CompiledKernel]:
    """Compiles every ``pallas_call`` of ``f(*args)`` with ``triton.compile`` (no GPU needed).

    ``compute_capability``: an NVIDIA target (``80``, ``90``) or an AMD architecture
    (``"gfx942"``, see ``pltriton.AMD_TARGETS``). When None: each call's
    ``CompilerParams.compute_capability``, the environment, the local GPU, else 80.
    """
    out = []
    for c in find_pallas_calls(f, *args, **kwargs):
        target = compute_capability or _target(c.compiler_params)
        if isinstance(target, str) and not target.startswith("sm_"):
            arch = amd_target(target).arch
            out.append(compile_lowered(c.lower(target=arch), arch))
        else:
            out.append(compile_lowered(c.lower(), target))
    return out


def emulate(f, *args, **kwargs):
    """Runs ``f``'s single ``pallas_call`` under Triton's interpreter; returns its outputs.

    The arguments are the ``pallas_call``'s operands (scalar prefetch first).
    """
    (k,) = lower(f, *args, **kwargs)
    outs = emulate_lowered(k, *args)
    return outs[0] if len(outs) == 1 else outs


__all__ = [
    "AMD_TARGETS", "AMDTarget", "DEFAULT_ROCM_ARCH", "amd_target", "rocm_arch",
    "code_object_usage", "instruction_mix",
    "CompiledKernel", "CompilerParams", "LoweredKernel", "PallasCall", "TritonLoweringError",
    "__version__", "approx_tanh", "atomic_add", "atomic_and", "atomic_cas", "atomic_max",
    "atomic_min", "atomic_or", "atomic_xchg", "atomic_xor", "compile", "debug_barrier",
    "elementwise_inline_asm", "compile_lowered", "dot", "emulate",
    "emulate_lowered", "find_pallas_calls", "inspect", "load", "lower", "max_contiguous",
    "store",
]
