"""Compiling one kernel (a :class:`pallas.plugins.KernelRequest`) with libtpu."""

from __future__ import annotations

import dataclasses

from pallas.plugins import KernelRequest, LevelUnsupportedError
from pallas_tpu._src.compiler.chips import DEFAULT_CHIP, TOPOLOGIES, resolve_chip
from pallas_tpu._src.compiler.client import WorkerCrashed, compile_in_child, libtpu_available
from pallas_tpu._src.compiler.export import export_kernel, is_semaphore
from pallas_tpu._src.compiler.results import (
    CompiledKernel,
    LibtpuMissingError,
    TpuCompileError,
    TpuCompilerCrashedError,
    mosaic_message,
)
from pallas_tpu._src.lowering.keys import physical_request

MISSING = ("the TPU compile level needs libtpu, the real TPU compiler: "
           "pip install 'pallas-tpu[compile]'")


def compile_request(request: KernelRequest, *, backend: str = "mosaic_tpu",
                    chip=None, default_chip: str = DEFAULT_CHIP,
                    dump_dir: str | None = None) -> CompiledKernel:
    """Lowers ``request`` with ``backend`` for ``tpu`` (here) and compiles it with libtpu
    for a deviceless ``chip`` (in the child process).

    ``chip``: see :func:`~pallas_tpu._src.compiler.chips.resolve_chip` (else
    ``request.options["chip"]``). ``dump_dir``: a folder to copy every Mosaic stage of
    the kernel into. Raises :class:`TpuCompileError` when the compiler rejects the
    kernel, :class:`TpuCompilerCrashedError` when it aborts, and
    :class:`LibtpuMissingError` without libtpu; our own lowering's errors propagate.
    """
    if chip is None:
        chip = request.options.get("chip")
    chip = resolve_chip(chip, request.compiler_params, default_chip)
    name = request.name or "kernel"
    params = request.compiler_params
    if params is None and backend == "mosaic_tpu":
        from pallas_tpu._src.compiler_params import CompilerParams

        params = CompilerParams()
    if dataclasses.is_dataclass(params) and "chip" in {f.name for f in
                                                       dataclasses.fields(params)}:
        # Lowering's trace-time checks (the VMEM footprint against the chip's scoped
        # limit) are then for the chip compiled for.
        request = dataclasses.replace(request,
                                      compiler_params=dataclasses.replace(params, chip=chip))
    if not libtpu_available():
        raise LibtpuMissingError(MISSING)
    # debug=True's printing is the emulator's (or the lowering's), not this export's;
    # typed PRNG keys are exported as their key data (JAX serialises no custom key type).
    request = dataclasses.replace(physical_request(request), debug=False)
    sems = [k for k, bm in enumerate(request.grid_mapping.in_block_mappings)
            if is_semaphore(bm.memory_space)]
    if sems:
        # Alone, the kernel would take the semaphore as a program parameter, which XLA
        # places in HBM and libtpu refuses as a DMA's flag; in a real program it comes
        # from the kernel that allocated it, in semaphore memory.
        raise LevelUnsupportedError(
            f"kernel {name!r} takes semaphores from another kernel (inputs {sems}); libtpu "
            f"compiles it only within the program that allocates them, not alone")
    return compile_exported(export_kernel(request, backend), chip=chip, name=name,
                            dump_dir=dump_dir)


def compile_exported(exported, *, chip=None, name: str = "kernel",
                     dump_dir: str | None = None) -> CompiledKernel:
    """Compiles a ``jax.export`` artifact for platform ``tpu`` holding one Mosaic kernel
    (one ``tpu_custom_call``, whoever lowered it) with libtpu for a deviceless ``chip``,
    in the compiler child process: the same figures as :func:`compile_request`.

    An artifact exported for several devices (the kernel under ``jax.shard_map``, e.g.
    with remote DMAs and ``lax.axis_index``) is compiled for as many devices of the
    chip's topology (up to 4), laid out as its mesh.

    ``exported``: a ``jax.export.Exported`` or its serialised bytes. ``chip``: see
    :func:`~pallas_tpu._src.compiler.chips.resolve_chip`. Raises ``ValueError`` when the
    artifact is not for ``tpu`` or does not hold exactly one kernel, and the errors of
    :func:`compile_request`.
    """
    import jax

    chip = resolve_chip(chip)
    if isinstance(exported, (bytes, bytearray)):
        exported = jax.export.deserialize(bytearray(exported))
    if "tpu" not in exported.platforms:
        raise ValueError(f"compile_exported: the artifact is exported for "
                         f"{exported.platforms}, not for 'tpu' (jax.export.export(..., "
                         f"platforms=['tpu']))")
    calls = exported.mlir_module().count("custom_call @tpu_custom_call(")
    if calls != 1:
        raise ValueError(f"compile_exported: the artifact holds {calls} Mosaic kernels "
                         f"(tpu_custom_call); export one kernel per artifact, so that the "
                         f"figures are that kernel's")
    if not libtpu_available():
        raise LibtpuMissingError(MISSING)
    msg = {"exported": bytes(exported.serialize()), "topology": TOPOLOGIES[chip],
           "name": name, "keep_dumps": dump_dir}
    try:
        out = compile_in_child(msg)
    except WorkerCrashed as e:
        raise TpuCompilerCrashedError(name, chip, str(e)) from None
    if out.get("error"):
        raise TpuCompileError(name, chip, mosaic_message(out["error"]))
    texts = out["texts"]
    mosaic = texts.get("post-apply-vector-layout-simplify",
                       texts.get("post-apply-vector-layout", ""))
    return CompiledKernel(
        name=name, chip=chip, vmem_bytes=int(out["scoped_memory"].get("1", 0)),
        scoped_memory=dict(out["scoped_memory"]), mosaic=mosaic,
        llo=texts.get("post-finalize-llo", ""), stages=tuple(out["stages"]),
        memory=dict(out.get("memory", {})), seconds=float(out["seconds"]))
