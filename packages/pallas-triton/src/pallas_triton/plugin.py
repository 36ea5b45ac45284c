"""The ``pallas.backends`` entry point: declares the Triton backend to pallas-core."""

from __future__ import annotations

from typing import Any

from pallas import plugins
from pallas_triton.__about__ import __version__
from pallas_triton._src.api import CompilerParams

CAPABILITIES = frozenset({
    "elementwise", "special_functions", "broadcasting", "reductions", "indexing",
    "control_flow", "dot",
    "multiple_outputs", "scratch", "atomics", "aliasing", "pytrees", "scalar_prefetch",
    "bf16", "f16", "int8", "uint32", "bool", "kernels", "vmap", "grad", "sequential_grid",
    "fusion",
    # Blocks of any shape: edge blocks and odd sizes become masks (only what a kernel
    # touches at once must have power-of-two dimensions).
    "unaligned_blocks",
})


class TritonBackend(plugins.Backend):
    """Lowers kernels to Triton for NVIDIA GPUs (compute capability 8.0+)."""

    def lower(self, request: plugins.LoweringRequest):
        from pallas_triton._src import gpu_call

        return gpu_call.lower_pallas_call(
            request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
            grid_mapping=request.grid_mapping, compiler_params=request.compiler_params,
            cost_estimate=request.cost_estimate, name=request.name,
            out_avals=request.out_avals)

    def validate(self, request: plugins.KernelRequest) -> None:
        compiler_params = request.compiler_params
        if compiler_params is not None and not isinstance(compiler_params, CompilerParams):
            if not isinstance(compiler_params, dict):
                raise TypeError(
                    f"the Triton backend takes pallas_triton.CompilerParams; got "
                    f"{type(compiler_params).__name__}")
        # Generating the Triton source is cheap and finds every construct the backend
        # cannot lower, so the error comes at trace time, naming the primitive.
        from pallas_triton._src.lowering import lower_kernel

        lower_kernel(request.jaxpr, request.grid_mapping, compiler_params)

    def compile(self, request: plugins.KernelRequest):
        """Lowers and compiles with ``triton.compile``; option ``compute_capability``
        (default: the compiler params', else 80)."""
        from pallas_triton._src import compile as tc
        from pallas_triton._src.lowering import lower_kernel

        lowered = lower_kernel(request.jaxpr, request.grid_mapping, request.compiler_params,
                               request.name)
        cc = (request.options.get("compute_capability")
              or tc.compute_capability(request.compiler_params))
        return tc.compile_lowered(lowered, cc)

    def emulate(self, request: plugins.KernelRequest, *args: Any):
        """Runs the generated kernel under Triton's interpreter; returns the outputs."""
        from pallas_triton._src.emulate import emulate_lowered
        from pallas_triton._src.lowering import lower_kernel

        lowered = lower_kernel(request.jaxpr, request.grid_mapping, request.compiler_params,
                               request.name)
        return emulate_lowered(lowered, *args)


BACKEND = TritonBackend(
    name="triton",
    version=__version__,
    platforms=("cuda",),
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
