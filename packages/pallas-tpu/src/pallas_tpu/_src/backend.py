"""The ``mosaic_tpu`` backend object: what it claims, how it validates and lowers."""

from __future__ import annotations

import jax
import numpy as np

from pallas.plugins import Backend, KernelRequest, LoweringRequest
from pallas_tpu.__about__ import __version__
from pallas_tpu._src.compiler_params import CompilerParams

# The conformance tags on which every catalogue case passes at levels ``lower`` and
# ``emulate`` (pallas-conformance, this release). Other tags fail only where a case uses
# block shapes that TPUs cannot tile (rejected at trace time, by design) or features
# listed as not implemented in the README; see the package README.
CAPABILITIES = frozenset({
    "aliasing", "bf16", "bool", "broadcasting", "carry_across_blocks", "control_flow", "dot",
    "dynamic_grid", "dynamic_shapes", "elementwise", "empty_ref", "f16", "float8", "fusion", "grad",
    "indexing", "int4", "int8", "kernels", "multiple_outputs", "pytrees", "reductions",
    "ref_bitcast", "reshapes", "scalar_prefetch", "scratch", "semaphores", "sequential_grid",
    "shard_map", "stack_pairs", "tpu_dmas", "tpu_values", "uint32", "vmap",
})


class MosaicTpuBackend(Backend):
    """Lowers ``pallas_call`` to a Mosaic TPU module inside a ``tpu_custom_call``.

    On ``cpu`` (and on TPU under ``pltpu.force_tpu_interpret_mode``) it lowers to TPU
    interpret mode: the core interpreter with the TPU primitives' rules. (Upstream raises
    on CPU unless ``interpret=True``; here every backend must be checkable on CPU.)
    """

    def race_kit(self):
        """DMAs, memory spaces and TPU interpret mode's race report, for the conformance
        suite's planted-race cases (``pallas_conformance.races``)."""
        from pallas_tpu._src.interpret.race_kit import TpuRaceKit

        return TpuRaceKit()

    def validate(self, request: KernelRequest) -> None:
        from pallas_tpu._src.validate import validate

        validate(request.jaxpr, request.grid_mapping, self.compiler_params_of(request),
                 request.name or "kernel")

    def lower(self, request: LoweringRequest):
        from pallas_tpu._src import core_compat
        from pallas_tpu._src.interpret.params import forced_params

        platforms = request.ctx.module_context.platforms
        bounds = tuple(request.grid_bounds)
        if forced_params() is not None:
            # pltpu.force_tpu_interpret_mode(params): the TPU simulation.
            return forced_params().lower_pallas_call(
                request.ctx, *bounds, *request.in_nodes, jaxpr=request.jaxpr,
                grid_mapping=request.grid_mapping, compiler_params=request.compiler_params,
                name=request.name)
        if "tpu" not in platforms:
            # On CPU the kernel runs in the core interpreter
            # with the TPU primitives' rules (registered when pallas_tpu is imported).
            return core_compat.lower_with_interpreter(
                request.ctx, *bounds, *request.in_nodes, jaxpr=request.jaxpr,
                grid_mapping=request.grid_mapping)
        from pallas_tpu._src.lowering.custom_call import lower_pallas_call

        params = self.artifact(request).compiler_params  # validated once, at trace time
        return lower_pallas_call(
            request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
            grid_mapping=request.grid_mapping, compiler_params=params,
            cost_estimate=request.cost_estimate, name=request.name,
            metadata=request.metadata, out_avals=request.out_avals, grid_bounds=bounds,
            debug=request.debug)

    def compile(self, request: KernelRequest):
        """Compiles the kernel with libtpu, the real TPU compiler, for a deviceless chip
        (``request.options["chip"]``, else ``CompilerParams(chip=)``, else
        ``$PALLAS_TPU_CHIP``, else v5e). Returns a ``pallas_tpu.compiler.CompiledKernel``;
        raises ``TpuCompileError`` when the compiler rejects the kernel and
        ``LibtpuMissingError`` (level skipped) without ``pallas-tpu[compile]``."""
        from pallas_tpu._src.compiler.kernel import compile_request

        return compile_request(request, backend=self.name, default_chip="v5e")

    def emulate(self, request: KernelRequest, *args):
        """Runs the generated Mosaic module: lowers the kernel as for a TPU, takes the
        ``tpu_custom_call``'s backend config and executes it with :mod:`pallas_tpu.executor`.
        """
        import jax.numpy as jnp

        from pallas_tpu._src.executor import run_custom_call
        from pallas_tpu._src.lowering.custom_call import backend_config, physical_avals
        from pallas_tpu._src.lowering.types import memory_dtype

        params = self.artifact(request).compiler_params
        config = backend_config(request.jaxpr, request.grid_mapping, params,
                                request.cost_estimate, request.name or "kernel")
        # As in the custom call, dynamic grid sizes are the first operands (``args``
        # starts with them) and alias indices count them.
        nb = request.grid_mapping.num_dynamic_grid_bounds
        # Bools (f16) cross the call as int32 (f32), as in the custom call
        # (T.memory_dtype); typed PRNG keys as their key data.
        args = [jax.random.key_data(a) if _is_key(a.dtype) else a for a in args]
        args = [jnp.asarray(a).astype(memory_dtype(jnp.asarray(a).dtype)) for a in args]
        outs = run_custom_call(config, args, [(a.shape, memory_dtype(a.dtype))
                                              for a in physical_avals(request.out_avals)],
                               tuple((i + nb, o) for i, o in
                                     request.grid_mapping.input_output_aliases))
        return [jax.random.wrap_key_data(o, impl=a.dtype._impl) if _is_key(a.dtype)
                else jnp.asarray(o).astype(a.dtype) for o, a in zip(outs, request.out_avals)]

    def emulator(self, request: KernelRequest):
        """The emulated device's plan: the Mosaic module generated and prepared for the
        executor once, then executed on each call's operands (numpy arrays)."""
        from pallas_tpu._src.executor import compile_module, execute, payload_of
        from pallas_tpu._src.lowering.custom_call import backend_config, physical_avals

        params = self.artifact(request).compiler_params
        config = backend_config(request.jaxpr, request.grid_mapping, params,
                                request.cost_estimate, request.name or "kernel",
                                debug=request.debug)
        kernel = compile_module(payload_of(config))
        nb = request.grid_mapping.num_dynamic_grid_bounds
        shapes = [(tuple(a.shape), np.dtype(a.dtype))
                  for a in physical_avals(request.out_avals)]  # keys: their key data
        aliases = tuple((i + nb, o) for i, o in request.grid_mapping.input_output_aliases)
        return lambda *args: execute(kernel, [np.asarray(x) for x in args], shapes, aliases)

    def interpret(self, request: KernelRequest, *args):
        """TPU interpret mode: the kernel jaxpr in the core interpreter with the TPU
        primitives' rules (checks the TPU semantics, not the generated module)."""
        from pallas_tpu._src import core_compat

        return core_compat.interpret_pallas_call(*args, jaxpr=request.jaxpr,
                                                 grid_mapping=request.grid_mapping)


def _is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


MOSAIC_TPU = MosaicTpuBackend(
    name="mosaic_tpu",
    version=__version__,
    platforms=("tpu", "cpu"),
    compiler_params_type=CompilerParams,
    capabilities=CAPABILITIES,
    levels=("lower", "compile", "backend_interpret", "emulate"),
    priority=-1,  # below the interpreter on cpu; the only TPU backend for "tpu"
    package="pallas-tpu",
    display_name="Mosaic TPU",
)
