"""Compiling TPU kernels with the real TPU compiler on a machine without a TPU.

``pallas_tpu.compile(f, *args, chip="v5e")`` traces ``f`` and compiles each of its
``pallas_call`` kernels with libtpu (``pip install 'pallas-tpu[compile]'``) for a
deviceless chip: Mosaic's whole pass pipeline and XLA's TPU backend, as on a TPU host.
Each :class:`CompiledKernel` reports the VMEM the compiler allocated, the final LLO and
its op mix, and the Mosaic module after layout. The compiler runs in a child process,
so that an abort inside it (a ``CHECK`` failure) is reported, not fatal, and its
initialisation messages stay out of the caller's output. The counterpart of
``pallas_mosaic_gpu.compiler.compile``. ``compile_exported`` compiles a ``jax.export``
artifact holding one kernel lowered by anyone (upstream's lowering, in benchmarks/).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

import pallas.plugins
from pallas.plugins import KernelRequest, pallas_call_eqns
from pallas_tpu._src.compiler.chips import (
    CHIPS,
    DEFAULT_CHIP,
    ENV_CHIP,
    TOPOLOGIES,
    canonical_chip,
    resolve_chip,
)
from pallas_tpu._src.compiler.client import libtpu_available
from pallas_tpu._src.compiler.kernel import compile_exported, compile_request
from pallas_tpu._src.compiler.results import (
    CompiledKernel,
    LibtpuMissingError,
    TpuCompileError,
    TpuCompilerCrashedError,
    llo_ops,
    op_mix,
)
from pallas_tpu._src.vmem import footprint

__all__ = ["CHIPS", "DEFAULT_CHIP", "ENV_CHIP", "TOPOLOGIES", "CompiledKernel",
           "LibtpuMissingError", "TpuCompileError", "TpuCompilerCrashedError", "compile",
           "canonical_chip", "compile_exported", "compile_request", "libtpu_available", "llo_ops", "op_mix",
           "resolve_chip", "vmem_footprint"]


def compile(f: Callable, *args: Any, chip: Any = None, dump_dir: str | None = None,  # noqa: A001
            **kwargs: Any) -> list[CompiledKernel]:
    """Compiles every ``pallas_call`` of ``f(*args, **kwargs)`` with libtpu for ``chip``.

    Args:
      f: a function that calls ``pallas_call`` (jitted or not); ``args``/``kwargs`` are
        arrays or ``jax.ShapeDtypeStruct``.
      chip: ``"v4"``, ``"v5e"``, ``"v5p"``, ``"v6e"`` or ``"7x"`` (or a
        ``pltpu.ChipVersion``). When ``None``: the kernel's
        ``pltpu.CompilerParams(chip=...)``, else ``$PALLAS_TPU_CHIP``, else ``"v5e"``.
      dump_dir: copy every stage Mosaic dumped for each kernel into this folder.

    Returns:
      One :class:`CompiledKernel` per ``pallas_call``, in program order.

    Raises:
      TpuCompileError: the compiler rejected a kernel (names the kernel, the chip and
        Mosaic's message). TpuCompilerCrashedError: it aborted on one.
      LibtpuMissingError: libtpu is not installed.
    """
    closed = jax.make_jaxpr(lambda *a: f(*a, **kwargs))(*args)
    out = []
    for eqn in pallas_call_eqns(closed.jaxpr):
        p = eqn.params
        # The backend a lowering for "tpu" picks (mosaic_sparsecore for SparseCore meshes).
        backend = pallas.plugins.select_backend("tpu", p.get("backend"),
                                                p.get("compiler_params"))
        request = KernelRequest.for_backend(backend, p)
        out.append(compile_request(request, backend=backend.name, chip=chip,
                                   dump_dir=dump_dir))
    return out


def vmem_footprint(f: Callable, *args: Any, **kwargs: Any) -> list:
    """The VMEM buffers of every ``pallas_call`` of ``f(*args, **kwargs)``, computed at
    trace time (no compiler): one list of ``VmemItem`` (``what``, ``shape``, ``dtype``,
    ``bytes_per_buffer``, ``buffers``, ``bytes``) per kernel, in program order. The sum
    is a lower bound of the compiler's ``CompiledKernel.vmem_bytes`` (Mosaic's internal
    scratch is not in it); see ``docs/tpu-compile.md``."""
    closed = jax.make_jaxpr(lambda *a: f(*a, **kwargs))(*args)
    return [footprint(eqn.params["grid_mapping"]) for eqn in pallas_call_eqns(closed.jaxpr)]
