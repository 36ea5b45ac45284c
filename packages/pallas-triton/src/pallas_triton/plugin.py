"""The ``pallas.backends`` entry point: declares the Triton backend to pallas-core."""

from __future__ import annotations

import contextlib
from typing import Any

from pallas import plugins
from pallas_triton.__about__ import __version__
from pallas_triton._src import quiet_rocm
from pallas_triton._src.api import CompilerParams

quiet_rocm.install()

CAPABILITIES = frozenset({
    "elementwise", "special_functions", "broadcasting", "reductions", "indexing",
    "control_flow", "dot",
    "multiple_outputs", "scratch", "atomics", "aliasing", "closed_over_refs", "pytrees",
    "stack_pairs",
    "scalar_prefetch",
    "bf16", "f16", "int8", "float8", "uint32", "bool", "kernels", "vmap", "grad", "sequential_grid",
    "fusion",
    # Blocks of any shape: edge blocks and odd sizes become masks (only what a kernel
    # touches at once must have power-of-two dimensions).
    "unaligned_blocks",
})


def _platform(request) -> str:
    """The platform a request is for: the lowering's, else option ``platform`` (the
    conformance suite's ``--platform``), else ``"rocm"`` when option ``target`` names an
    AMD architecture, else ``"cuda"``."""
    platform = getattr(request, "platform", None) or request.options.get("platform")
    if platform is None and hasattr(request, "ctx"):
        platform = request.ctx.module_context.platforms[0]
    if platform is None:
        platform = "rocm" if str(request.options.get("target", "")).startswith(
            ("gfx", "rocm")) else "cuda"
    return platform


def _amd_arch(request) -> str:
    from pallas_triton._src.targets import amd_target, rocm_arch

    target = request.options.get("target")
    return amd_target(target).arch if target else rocm_arch(request.compiler_params)


class TritonBackend(plugins.Backend):
    """Lowers kernels to Triton for NVIDIA GPUs (compute capability 8.0+) and AMD GPUs
    (CDNA2/3/4, RDNA3: gfx90a, gfx942, gfx950, gfx1100)."""

    def lower(self, request: plugins.LoweringRequest):
        from pallas_triton._src import gpu_call, rocm_call

        if _platform(request) == "rocm":
            return rocm_call.lower_pallas_call(
                request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                grid_mapping=request.grid_mapping,
                compiler_params=request.compiler_params, name=request.name,
                out_avals=request.out_avals)
        return gpu_call.lower_pallas_call(
            request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
            grid_mapping=request.grid_mapping, compiler_params=request.compiler_params,
            cost_estimate=request.cost_estimate, name=request.name,
            out_avals=request.out_avals)

    @contextlib.contextmanager
    def targeting(self, platform: str, target: str | None = None):
        """Lowerings for ``platform`` inside the block target ``target``: an AMD
        architecture for ``rocm`` (``PALLAS_TRITON_ROCM_ARCH``), a compute capability
        (``90``, ``"sm_90"``) for ``cuda`` (``PALLAS_TRITON_COMPUTE_CAPABILITY``)."""
        from pallas_triton._src.compile import ENV_COMPUTE_CAPABILITY
        from pallas_triton._src.targets import ENV_ROCM_ARCH, amd_target

        self.check_platform(platform)
        if target is None:
            yield
            return
        if platform == "rocm":
            var, value = ENV_ROCM_ARCH, amd_target(target).arch
        else:
            var, value = ENV_COMPUTE_CAPABILITY, str(target).removeprefix("sm_").rstrip("a")
            if not value.isdigit():
                raise ValueError(f"a cuda target is a compute capability (80, 'sm_90'); "
                                 f"got {target!r}")
        with self.environ(var, value):
            yield

    def build(self, request: plugins.KernelRequest) -> plugins.KernelArtifact:
        """Generates the Triton source for NVIDIA GPUs once (cheap, and it finds every
        construct the backend cannot lower, so the error comes at trace time, naming the
        primitive); ``lower``, ``compile`` and ``emulate`` for cuda use it."""
        from pallas_triton._src.lowering import lower_kernel

        params = self.compiler_params_of(request)
        lowered = lower_kernel(request.jaxpr, request.grid_mapping, params, request.name)
        return plugins.KernelArtifact(backend=self.name, compiler_params=params,
                                      payload=lowered)

    def validate(self, request: plugins.KernelRequest) -> None:
        self.artifact(request)

    def compile(self, request: plugins.KernelRequest):
        """Lowers and compiles with ``triton.compile``. Options: ``platform``
        (``"cuda"``, ``"rocm"``) and ``target`` (``"sm_90"``/``90``, ``"gfx942"``), or
        ``compute_capability``; defaults: the compiler params', the environment's
        (``PALLAS_TRITON_COMPUTE_CAPABILITY``, ``PALLAS_TRITON_ROCM_ARCH``), sm_80 and
        gfx942."""
        from pallas_triton._src import compile as tc

        if _platform(request) == "rocm":
            from pallas_triton._src.rocm_call import compile_fitting

            return compile_fitting(request.jaxpr, request.grid_mapping,
                                   self.compiler_params_of(request), request.name,
                                   _amd_arch(request))[1]
        return tc.compile_lowered(self.artifact(request).payload, _cuda_cc(request))

    def emulate(self, request: plugins.KernelRequest, *args: Any):
        """Runs the generated kernel under Triton's interpreter; returns the outputs.
        For ``platform="rocm"`` it is the source generated for the AMD target (options
        as :meth:`compile`), which differs from NVIDIA's only where the target does."""
        from pallas_triton._src.emulate import emulate_lowered

        return emulate_lowered(self._emulated_source(request), *args)

    def emulator(self, request: plugins.KernelRequest):
        """The emulated device's plan: the Triton source generated once (for the AMD
        target on a ``rocm`` device, options as :meth:`compile`), then run under Triton's
        interpreter on each call's operands."""
        from pallas_triton._src.emulate import emulate_lowered

        lowered = self._emulated_source(request)
        return lambda *args: emulate_lowered(lowered, *args)

    def _emulated_source(self, request: plugins.KernelRequest):
        """The Triton source the emulate level runs: the artifact's for an NVIDIA target
        (float8 refused where the target lacks it, as compile refuses it), else the
        source generated for the AMD target."""
        from pallas_triton._src.compile import check_float8
        from pallas_triton._src.lowering import lower_kernel

        if _platform(request) != "rocm":
            lowered = self.artifact(request).payload
            check_float8(lowered, _cuda_cc(request))
            return lowered
        return lower_kernel(request.jaxpr, request.grid_mapping,
                            self.compiler_params_of(request), request.name,
                            target=_amd_arch(request))


def _cuda_cc(request: plugins.KernelRequest) -> int | str:
    """The NVIDIA target of a level: the ``target``/``compute_capability`` option, else
    the compiler params', the environment's, the emulated or local GPU's, or sm_80."""
    from pallas_triton._src import compile as tc

    cc = (request.options.get("target") or request.options.get("compute_capability")
          or tc.compute_capability(request.compiler_params))
    return int(str(cc).removeprefix("sm_").rstrip("a"))


BACKEND = TritonBackend(
    name="triton",
    version=__version__,
    platforms=("cuda", "rocm"),
    compiler_params_type=CompilerParams,
    capabilities=CAPABILITIES,
    levels=("lower", "compile", "emulate"),
    priority=10,
    package="pallas-triton",
    display_name="Triton",  # errors say e.g. "not supported in the Triton backend"
)


@plugins.hookimpl
def pallas_backends():
    return [BACKEND]


@plugins.hookimpl
def pallas_interpret_rules():
    from pallas_triton._src.primitives import INTERPRET_RULES

    return dict(INTERPRET_RULES)
