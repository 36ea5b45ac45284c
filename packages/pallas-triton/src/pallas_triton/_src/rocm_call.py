"""The ``lower`` level for platform ``rocm``: XLA's own Triton custom call.

The kernel is lowered for the AMD target (:func:`.targets.rocm_arch`), compiled by
``triton.compile`` for it (so what the target lacks, or a kernel that does not fit its
LDS, fails here, naming the target), and its Triton IR (TTIR) is emitted in the custom
call ``__gpu$xla.gpu.triton`` that XLA's GPU compiler for ROCm compiles and launches, as
upstream Pallas 0.10.2 does. The TTIR is re-serialised as MLIR bytecode by jaxlib's
Triton dialect, the same dialect build as XLA's, so what is emitted is what the device
side parses (:func:`read_backend_config` reads it back). Why this call and not jaxlib's
``triton_kernel_call``: ``docs/amd.md``.
"""

from __future__ import annotations

import dataclasses
import io
import re

from jax.interpreters import mlir
from jaxlib.mlir import ir

from pallas_triton._src.api import CompilerParams
from pallas_triton._src.compile import compile_lowered
from pallas_triton._src.kernel_call import emit_kernel_call
from pallas_triton._src.lowering import lower_kernel
from pallas_triton._src.targets import amd_target, check_fits, rocm_arch

CUSTOM_CALL_TARGET = "__gpu$xla.gpu.triton"


def _triton_context() -> ir.Context:
    from jaxlib.triton import dialect as tt_dialect

    ctx = mlir.make_ir_context()  # JAX's dialects, gpu among them
    tt_dialect.register_dialect(ctx)
    ctx.allow_unregistered_dialects = False
    return ctx


_BARRIER = re.compile(r"\bttg\.barrier\s+(\w+)")


def for_xla(ttir: str) -> str:
    """Triton 3.9's TTIR in the dialects XLA's Triton reads: ``tl.debug_barrier()``
    is ``ttg.barrier all`` in 3.9, a TritonGPU op that XLA's TTIR input does not know;
    it is ``gpu.barrier`` (a workgroup barrier after all memory accesses), as upstream
    Pallas emits it."""

    def barrier(m):
        if m.group(1) != "all":
            raise ValueError(f"no XLA equivalent of Triton's {m.group(0)!r}")
        return "gpu.barrier"

    return _BARRIER.sub(barrier, ttir)


def ttir_bytecode(ttir: str) -> bytes:
    """``ttir`` (Triton's text) parsed and verified by jaxlib's Triton dialect, as
    MLIR bytecode: the form XLA reads from the backend config."""
    with _triton_context():
        module = ir.Module.parse(for_xla(ttir))
        if not module.operation.verify():
            raise ValueError("the kernel's TTIR does not verify in jaxlib's Triton dialect")
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        return buf.getvalue()


def canonical_ttir(ir_text_or_bytecode: str | bytes) -> str:
    """The TTIR as jaxlib's Triton dialect prints it (without locations): the same text
    for a kernel's TTIR and for the bytecode made of it."""
    if isinstance(ir_text_or_bytecode, str):
        ir_text_or_bytecode = for_xla(ir_text_or_bytecode)
    with _triton_context():
        module = ir.Module.parse(ir_text_or_bytecode)
        return module.operation.get_asm(enable_debug_info=False)


@dataclasses.dataclass(frozen=True)
class TritonCallConfig:
    """The fields of ``__gpu$xla.gpu.triton``'s backend config, as XLA reads them."""

    name: str
    ir: bytes  # the TTIR module, MLIR bytecode
    num_warps: int
    num_stages: int
    grid: tuple[int, int, int]
    debug: bool

    def attributes(self) -> dict[str, ir.Attribute]:
        gx, gy, gz = self.grid
        return {
            "name": ir.StringAttr.get(self.name),
            "ir": ir.StringAttr.get(self.ir),
            "num_stages": mlir.i32_attr(self.num_stages),
            "num_warps": mlir.i32_attr(self.num_warps),
            "grid_x": mlir.i32_attr(gx),
            "grid_y": mlir.i32_attr(gy),
            "grid_z": mlir.i32_attr(gz),
            "debug": ir.BoolAttr.get(self.debug),
        }


def backend_config(compiled) -> TritonCallConfig:
    """The config of one launch of a kernel compiled for an AMD target."""
    lowered = compiled.lowered
    return TritonCallConfig(
        name=compiled.name, ir=ttir_bytecode(compiled.ttir), num_warps=lowered.num_warps,
        num_stages=lowered.num_stages, grid=tuple(lowered.launch_grid), debug=False)


def read_backend_config(module_text: str) -> list[TritonCallConfig]:
    """Every ``__gpu$xla.gpu.triton`` config in a lowered module's text (what
    ``jax.jit(f).trace(x).lower(lowering_platforms=("rocm",)).as_text()`` returns),
    read back from the module as XLA would: by field name from the dictionary."""
    ctx = mlir.make_ir_context()
    out = []
    with ctx:
        module = ir.Module.parse(module_text)
        ops = []

        def walk(op):
            op = op.operation
            if op.name == "stablehlo.custom_call" and ir.StringAttr(
                    op.attributes["call_target_name"]).value == CUSTOM_CALL_TARGET:
                ops.append(op)
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        walk(inner)

        walk(module.operation)
        for op in ops:
            d = ir.DictAttr(op.attributes["mhlo.backend_config"])
            out.append(TritonCallConfig(
                name=ir.StringAttr(d["name"]).value,
                ir=ir.StringAttr(d["ir"]).value_bytes,
                num_warps=ir.IntegerAttr(d["num_warps"]).value,
                num_stages=ir.IntegerAttr(d["num_stages"]).value,
                grid=tuple(ir.IntegerAttr(d[f"grid_{a}"]).value for a in "xyz"),
                debug=ir.BoolAttr(d["debug"]).value))
    return out


def _layout(aval) -> list[int]:
    return list(reversed(range(len(aval.shape))))


def compile_fitting(jaxpr, grid_mapping, compiler_params, name: str, arch: str):
    """Lowers and compiles for the AMD ``arch``; ``(lowered, compiled)``.

    When the default software pipelining (2 stages) needs more LDS than the target has
    per workgroup, the kernel is compiled again unpipelined (``num_stages=1``), as the
    MI300's 64 KiB hold less than an NVIDIA GPU's shared memory; a kernel still too big,
    or whose ``num_stages`` was set explicitly, raises :class:`TargetLacksError`."""
    lowered = lower_kernel(jaxpr, grid_mapping, compiler_params, name, target=arch)
    compiled = compile_lowered(lowered, arch)
    explicit = getattr(compiler_params, "num_stages", None) is not None
    if (not explicit and lowered.num_stages > 1
            and compiled.shared_mem_bytes > amd_target(arch).lds_bytes):
        base = (compiler_params if isinstance(compiler_params, CompilerParams)
                else CompilerParams())
        params = dataclasses.replace(base, num_stages=1)
        lowered = lower_kernel(jaxpr, grid_mapping, params, name, target=arch)
        compiled = compile_lowered(lowered, arch)
    check_fits(compiled)
    return lowered, compiled


def lower_pallas_call(ctx, *in_nodes, jaxpr, grid_mapping, compiler_params, name,
                      out_avals):
    arch = rocm_arch(compiler_params)
    _, compiled = compile_fitting(jaxpr, grid_mapping, compiler_params, name, arch)
    config = backend_config(compiled)
    return emit_kernel_call(
        ctx, CUSTOM_CALL_TARGET, in_nodes, grid_mapping, out_avals,
        backend_config=config.attributes(), api_version=4,
        operand_layouts=[_layout(a) for a in ctx.avals_in],
        result_layouts=[_layout(a) for a in out_avals])
