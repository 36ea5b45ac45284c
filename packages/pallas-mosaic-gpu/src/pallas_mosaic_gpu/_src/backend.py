"""The ``mosaic_gpu`` backend object: what it claims and how it lowers."""

from __future__ import annotations

import contextlib

from pallas.plugins import Backend, KernelRequest, LoweringRequest, resolve_compiler_params
from pallas_mosaic_gpu.__about__ import __version__
from pallas_mosaic_gpu._src.compiler_params import CompilerParams
from pallas_mosaic_gpu._src.interpret.params import InterpretParams

# Conformance tags whose every case passes at each level this backend provides (lower,
# and compile where the toolchain is installed); measured by running the catalogue.
# grad: the backward kernels pallas-core generates lower here (or fall back to XLA).
# scratch: scratch buffers live in SMEM, carried from step to step along the sequential
# grid axes (the loop each CUDA block runs), which the carried-state backward sweep uses.
# Not claimed although their claimed-tag cases would pass: carry_across_blocks (parallel
# grid axes run concurrently on a GPU), atomics and semaphores (not lowered yet).
CAPABILITIES: frozenset = frozenset({
    "elementwise", "special_functions", "bf16", "f16", "int8", "float8", "uint32", "bool", "dot",
    "multiple_outputs", "sequential_grid", "vmap", "shard_map", "kernels", "reductions",
    "broadcasting", "pytrees", "fusion", "grad", "scratch",
    # control_flow: lax.scan over register arrays reads and writes its rows through SMEM
    # buffers (lowering/rules_control.py).
    "control_flow",
    # indexing: strided windows and masked pl.load/pl.store element by element
    # (lowering/elements.py), BoundedSlice blocks copied by threads up to their size. A
    # kernel needing more SMEM than a block has raises SmemExceededError, which the
    # suite reports unsupported (lowering/smem_budget.py); no catalogue case does today.
    "indexing",
    # aliasing: input_output_aliases become XLA buffer aliases of the custom call, and an
    # aliased output's blocks are loaded before each step (lowering/aliases.py).
    "aliasing",
    # plgpu's own primitives (conformance cases/gpu.py): warpgroup meshes, TMA + mbarrier
    # pipelines, wgmma from swizzled SMEM, clusters (multicast TMA loads, cluster
    # barriers; lowered, compiled for sm_90a and executed at emulate).
    "warpgroups", "tma_pipelines", "wgmma", "clusters",
    # export: the cases export for cuda (the mosaic_gpu_v2 call is jax.export-stable),
    # round-trip and are embedded in code lowered for cuda; compile and emulate cannot
    # see a kernel sealed in an artifact, and skip them.
    "export",
})


def _levels() -> tuple[str, ...]:
    """``lower`` and ``emulate``, plus ``compile`` when ptxas, libdevice and the CUDA
    plugin are here."""
    from pallas_mosaic_gpu._src.toolchain import ToolchainMissingError, check_plugin, find_toolchain

    try:
        check_plugin()
        find_toolchain()
    except ToolchainMissingError:
        return ("lower", "emulate")
    return ("lower", "compile", "emulate")


class MosaicGpuBackend(Backend):
    """Lowers ``pallas_call`` to the Mosaic GPU compiler library's custom call."""

    @contextlib.contextmanager
    def targeting(self, platform: str, target: str | None = None):
        """Lowerings and compiles inside the block target ``target`` (``"sm_90a"`` or
        ``"sm_100a"``) through ``PALLAS_MOSAIC_GPU_TARGET``, as the conformance suite's
        and the bundle's ``--target`` ask."""
        from pallas_mosaic_gpu._src.compile import ENV_TARGET, TARGETS

        self.check_platform(platform)
        if target is None:
            yield
            return
        if target not in TARGETS:
            raise ValueError(f"Mosaic GPU compiles for {', '.join(TARGETS)}; got target "
                             f"{target!r}")
        with self.environ(ENV_TARGET, target):
            yield

    def lower(self, request: LoweringRequest):
        from pallas_mosaic_gpu._src.lowering import lower_pallas_call

        return lower_pallas_call(request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                                 grid_mapping=request.grid_mapping,
                                 compiler_params=self.compiler_params_of(request),
                                 name=request.name)

    def validate(self, request: KernelRequest) -> None:
        """Builds the kernel at trace time, so what cannot lower fails there, naming
        the primitive."""
        import jax

        from pallas_mosaic_gpu._src.lowering import build

        build(request.jaxpr, request.grid_mapping, self.compiler_params_of(request),
              request.name or "kernel", jax_mesh=jax.sharding.get_abstract_mesh())

    def emulate(self, request: KernelRequest, *args):
        """Runs the generated code: builds the kernel as for a GPU and executes the
        Mosaic GPU module its custom call carries with :mod:`pallas_mosaic_gpu._src.executor`."""
        from pallas_mosaic_gpu._src.executor import emulate_kernel

        return emulate_kernel(request.jaxpr, request.grid_mapping,
                              self.compiler_params_of(request), request.name or "kernel",
                              args, request.out_avals)

    def emulator(self, request: KernelRequest):
        """The emulated device's plan: the kernel built (for the emulated target) and its
        module prepared for the executor once, then executed on each call's operands."""
        from pallas_mosaic_gpu._src.executor import plan_kernel

        return plan_kernel(request.jaxpr, request.grid_mapping,
                           self.compiler_params_of(request), request.name or "kernel",
                           request.out_avals, target=request.options.get("target"))

    def device_interpret_mode(self):
        """Mosaic GPU's interpret mode: it runs every device's threads, with
        ``plgpu.remote_ref`` reads and writes and remote semaphores between them."""
        return InterpretParams()

    def compile(self, request: KernelRequest):
        """Compiles on a compile-only device; ``request.options["target"]``: ``"sm_90a"``
        (default) or ``"sm_100a"``. Returns a ``pallas_mosaic_gpu.compiler.CompiledKernel``."""
        from pallas_mosaic_gpu._src.compile import compile_kernel

        return compile_kernel(request.jaxpr, request.grid_mapping,
                              self.compiler_params_of(request),
                              name=request.name or "kernel",
                              target=request.options.get("target"))


MOSAIC_GPU = MosaicGpuBackend(
    name="mosaic_gpu",
    version=__version__,
    platforms=("cuda",),
    compiler_params_type=CompilerParams,
    capabilities=CAPABILITIES,
    levels=_levels(),
    # Below pallas-triton (10) until the lowering lands: the default for cuda stays a
    # backend that lowers.
    priority=0,
    package="pallas-mosaic-gpu",
    display_name="Mosaic GPU",
)


def params(compiler_params) -> CompilerParams:
    """``compiler_params`` as a ``plgpu.CompilerParams`` (None means the defaults): the
    core's coercion (``pallas.plugins.resolve_compiler_params``) for this backend."""
    return resolve_compiler_params(MOSAIC_GPU, compiler_params)
