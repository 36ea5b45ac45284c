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

    def lower(self, ctx, *in_nodes, jaxpr, grid_mapping, compiler_params, cost_estimate,
              name, metadata, out_avals):
        from pallas_triton._src import gpu_call

        return gpu_call.lower_pallas_call(
            ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping,
            compiler_params=compiler_params, cost_estimate=cost_estimate, name=name,
            out_avals=out_avals)

    def validate(self, jaxpr, grid_mapping, compiler_params) -> None:
        if compiler_params is not None and not isinstance(compiler_params, CompilerParams):
            if not isinstance(compiler_params, dict):
                raise TypeError(
                    f"the Triton backend takes pallas_triton.CompilerParams; got "
                    f"{type(compiler_params).__name__}")
        # Generating the Triton source is cheap and finds every construct the backend
        # cannot lower, so the error comes at trace time, naming the primitive.
        from pallas_triton._src.lowering import lower_kernel

        lower_kernel(jaxpr, grid_mapping, compiler_params)

    def compile(self, jaxpr, grid_mapping, compiler_params, **kw: Any):
        """Lowers and compiles with ``triton.compile``; ``compute_capability=`` (80)."""
        from pallas_triton._src import compile as tc
        from pallas_triton._src.lowering import lower_kernel

        lowered = lower_kernel(jaxpr, grid_mapping, compiler_params, kw.get("name"))
        cc = kw.get("compute_capability") or tc.compute_capability(compiler_params)
        return tc.compile_lowered(lowered, cc)

    def emulate(self, jaxpr, grid_mapping, compiler_params, *args, **kw: Any):
        """Runs the generated kernel under Triton's interpreter; returns the outputs."""
        from pallas_triton._src.emulate import emulate_lowered
        from pallas_triton._src.lowering import lower_kernel

        lowered = lower_kernel(jaxpr, grid_mapping, compiler_params, kw.get("name"))
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
)


@plugins.hookimpl
def pallas_backends():
    return [BACKEND]


@plugins.hookimpl
def pallas_interpret_rules():
    from pallas_triton._src.primitives import INTERPRET_RULES

    return dict(INTERPRET_RULES)
