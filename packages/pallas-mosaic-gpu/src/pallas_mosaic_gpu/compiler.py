"""Compiling Mosaic GPU kernels on a machine without a GPU (the compile level).

``compile(f, *args)`` traces ``f``, and compiles each of its ``pallas_call`` kernels
through Mosaic GPU's pass pipeline, PTX and ptxas for a compile-only CUDA device;
each :class:`CompiledKernel` reports registers, spills, shared memory, the PTX and its
instruction mix, and whether ``wgmma``/``tcgen05`` instructions appear.
"""

from __future__ import annotations

import jax

from pallas.plugins import pallas_call_eqns
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.compile import (
    DEFAULT_TARGET,
    ENV_TARGET,
    TARGETS,
    CompiledKernel,
    ToolchainMissingError,
    compile_kernel,
    find_toolchain,
    target_config,
)

__all__ = ["DEFAULT_TARGET", "ENV_TARGET", "TARGETS", "CompiledKernel",
           "ToolchainMissingError", "compile", "find_toolchain", "target_config"]


def compile(f, *args, target: str | None = None) -> list[CompiledKernel]:  # noqa: A001
    """Compiles every ``pallas_call`` of ``f(*args)`` for ``target`` (``"sm_90a"``, the
    default, or ``"sm_100a"``; one target per process, as Mosaic GPU fixes it)."""
    closed = jax.make_jaxpr(f)(*args)
    out = []
    for eqn in pallas_call_eqns(closed.jaxpr):
        p = eqn.params
        out.append(compile_kernel(p["jaxpr"], p["grid_mapping"], params(p["compiler_params"]),
                                  name=p.get("name") or "kernel", target=target))
    return out
