"""The ``mosaic_sparsecore`` backend object: what it claims, how it validates and lowers."""

from __future__ import annotations

import contextlib
import dataclasses

from pallas.plugins import Backend, KernelRequest, LoweringRequest
from pallas_tpu import CoreType, MemorySpace
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore.__about__ import __version__
from pallas_tpu_sparsecore._src.compiler_params import CompilerParams

# Conformance tags on which every catalogue case passes at levels lower and
# backend_interpret: the SparseCore cases (pallas_conformance/cases/sparsecore.py). The
# rest of the catalogue is blocked pallas_call grids, which this backend does not take.
CAPABILITIES = frozenset({"sparsecore"})

# Kernels this backend does not take raise NotImplementedError (it does not claim
# them), so that e.g. the quickstart reports them "unsupported" for it.
_NOT_A_MESH = (
    "the mosaic_sparsecore backend runs a kernel over SparseCores: pl.kernel over a "
    "plsc.VectorSubcoreMesh or plsc.ScalarSubcoreMesh, or a pallas_call whose grid is "
    "(cores, subcores) or (cores,); got grid {grid}"
)


def target_info(params):
    """The SparseCore figures the kernel is checked and lowered for."""
    from pallas_tpu_sparsecore._src.info import get_sparse_core_info, get_sparse_core_info_for_chip

    chip = getattr(params, "chip", None)
    return get_sparse_core_info_for_chip(chip) if chip is not None else get_sparse_core_info()


#: The chip the compile level compiles for when none is chosen.
DEFAULT_COMPILE_CHIP = "v5p"


def _traced_chip():
    """The chip kernels are being traced for, if one was chosen; else the default."""
    from pallas_tpu_sparsecore._src.info import chosen_chip

    return chosen_chip() or DEFAULT_COMPILE_CHIP


def _chip_of(params):
    from pallas_tpu_sparsecore._src.info import target_chip

    chip = getattr(params, "chip", None)
    return target_chip(chip) if chip is not None else contextlib.nullcontext()


class MosaicSparseCoreBackend(Backend):
    """Lowers SparseCore mesh kernels to a Mosaic module with a SparseCore core type,
    inside a ``tpu_custom_call`` of device type SparseCore."""

    def validate(self, request: KernelRequest) -> None:
        from pallas_tpu_sparsecore._src.info import current_chip

        params = self.compiler_params_of(request)
        gm = request.grid_mapping
        if len(gm.grid) not in (1, 2):
            raise NotImplementedError(_NOT_A_MESH.format(grid=tuple(gm.grid)))
        names = tuple(gm.grid_names or ()) or ("cores", "subcores")[:len(gm.grid)]
        # Operands are whole, in HBM or in the mesh's own default memory space (an
        # upstream-style mesh object may say e.g. SMEM).
        mesh_space = getattr(getattr(gm, "mesh", None), "default_memory_space", None)
        for bm in gm.block_mappings:
            whole = tuple(bm.block_shape) == tuple(bm.array_aval.shape)
            space = bm.memory_space
            in_hbm = (space is None or tpx.is_any_space(space) or space is MemorySpace.HBM
                      or (mesh_space is not None and space is mesh_space))
            if not whole or not in_hbm:
                raise NotImplementedError(
                    f"the mosaic_sparsecore backend takes kernel operands whole in HBM; "
                    f"{bm.origin} has block shape {tuple(bm.block_shape)} in "
                    f"{'the default space' if space is None else space} (array "
                    f"{tuple(bm.array_aval.shape)}): use pl.BlockSpec(memory_space=pl.ANY) "
                    f"or pltpu.HBM and copy blocks with pltpu DMAs or pltpu.emit_pipeline")
        from pallas_tpu_sparsecore._src.dma_checks import check_indexed_dmas

        check_indexed_dmas(request.jaxpr.jaxpr)
        if params.dimension_semantics is not None:
            raise ValueError("SparseCore meshes do not take dimension_semantics= (the mesh "
                             "axes are core_parallel and subcore_parallel)")
        info = target_info(params)
        chip = getattr(params, "chip", None) or current_chip()
        limits = [("num_cores", info.num_cores, "SparseCores"),
                  ("num_subcores", info.num_subcores, "vector subcores per SparseCore")]
        for size, name, (what, limit, unit) in zip(gm.grid, names, limits):
            if size > limit:
                raise ValueError(
                    f"the mesh axis {name!r} has {what}={size}, but TPU {chip} has only "
                    f"{limit} {unit}; valid: 1..{limit}")

    def lower(self, request: LoweringRequest):
        platforms = request.ctx.module_context.platforms
        name = request.name
        if "tpu" not in platforms:
            raise ValueError(
                f"Only interpret mode is supported on CPU: the SparseCore kernel {name} "
                f"(backend 'mosaic_sparsecore') lowers for platform 'tpu', not "
                f"{', '.join(platforms)}. Pass interpret=True to run it here, or lower it "
                f"for a TPU: jax.jit(f).trace(*args).lower(lowering_platforms=('tpu',)).")
        from pallas_tpu_sparsecore._src.lowering.module import lower_to_custom_call

        params = self.artifact(request).compiler_params  # validated once
        with _chip_of(params):  # lane checks and figures follow plsc.CompilerParams(chip=)
            return lower_to_custom_call(request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                                        grid_mapping=request.grid_mapping, params=params,
                                        info=target_info(params),
                                        cost_estimate=request.cost_estimate, name=name,
                                        metadata=request.metadata,
                                        out_avals=request.out_avals)

    def compile(self, request: KernelRequest):
        """Compiles the kernel with libtpu, the real TPU compiler, for a deviceless chip
        with SparseCores (``request.options["chip"]``, else ``plsc.CompilerParams(chip=)``,
        else ``$PALLAS_TPU_CHIP``, else v5p); the lowering checks the kernel against the
        same chip. Without any of those it is the chip the kernel was traced for, when one
        was chosen (:func:`plsc.target_chip`, ``$PALLAS_SPARSECORE_CHIP``), else v5p.
        Returns a ``pallas_tpu.compiler.CompiledKernel``."""
        from pallas_tpu.compiler import compile_request, resolve_chip
        from pallas_tpu_sparsecore._src.info import canonical_chip

        params = self.compiler_params_of(request)
        chip = resolve_chip(request.options.get("chip"), params, default=_traced_chip())
        params = dataclasses.replace(params, chip=canonical_chip(chip))
        request = dataclasses.replace(request, compiler_params=params)
        return compile_request(request, backend=self.name, chip=chip, default_chip="v5p")

    def targeting(self, platform: str, target=None):
        """SparseCore kernels inside the block are traced, lowered and compiled for the
        chip ``target`` (``"v5p"``, ``"v6e"``, ``"7x"``): their lanes per vector and
        subcore counts depend on it. The conformance suite's ``--chip``/``--target``
        reach here; without one it targets v5p (the compile level's default chip) unless
        ``$PALLAS_SPARSECORE_CHIP`` chooses one."""
        import os

        from pallas_tpu_sparsecore._src.info import ENV_VAR, target_chip

        self.check_platform(platform)
        if target is None and os.environ.get(ENV_VAR):
            return contextlib.nullcontext()
        return target_chip(DEFAULT_COMPILE_CHIP if target is None else target)

    def interpret(self, request: KernelRequest, *args):
        """The kernel jaxpr in the core interpreter with the SparseCore rules (mesh
        points in order, gathers/scatters bounds-checked)."""
        from pallas.plugins import interpret_pallas_call

        self.artifact(request)  # validated once
        return interpret_pallas_call(*args, jaxpr=request.jaxpr,
                                     grid_mapping=request.grid_mapping)


MOSAIC_SPARSECORE = MosaicSparseCoreBackend(
    name="mosaic_sparsecore",
    version=__version__,
    platforms=("tpu", "cpu"),
    compiler_params_type=CompilerParams,
    capabilities=CAPABILITIES,
    levels=("lower", "compile", "backend_interpret"),
    # Never the default: SparseCore kernels select it through their mesh or
    # plsc.CompilerParams; plain TPU kernels keep mosaic_tpu.
    priority=-10,
    package="pallas-tpu-sparsecore",
    display_name="Mosaic SparseCore",
    # pl.kernel over an upstream-style mesh object picks this backend by its core_type.
    core_types=(CoreType.SC_VECTOR_SUBCORE, CoreType.SC_SCALAR_SUBCORE),
)
