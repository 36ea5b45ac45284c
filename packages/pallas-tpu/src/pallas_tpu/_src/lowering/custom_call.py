"""Emits the ``tpu_custom_call`` for a lowered kernel (JAX's Mosaic packaging)."""

from __future__ import annotations

import sys

from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.compiler_params import CompilerParams, SideEffectType
from pallas_tpu._src.lowering.kernel import build_module
from pallas_tpu._src.lowering.keys import physicalize
from pallas_tpu._src.lowering.symbolic import annotate
from pallas_tpu._src.lowering.types import is_widened, memory_dtype


def side_effect_type(value):
    if isinstance(value, SideEffectType):
        return getattr(jc.TpuSideEffectType, value.name)
    return jc.TpuSideEffectType.SIDE_EFFECTING if value else jc.TpuSideEffectType.PURE


def cost_dict(cost_estimate):
    if cost_estimate is None:
        return None
    return jc.CostEstimateDict(
        flops=int(cost_estimate.flops), transcendentals=int(cost_estimate.transcendentals),
        bytes_accessed=int(cost_estimate.bytes_accessed),
        remote_bytes_transferred=int(getattr(cost_estimate, "remote_bytes_transferred", 0)),
    )


def mesh_axes_of(ctx) -> tuple:
    """((name, size), ...) of the shard_map mesh the call is lowered in, if any."""
    mesh = getattr(ctx.module_context.axis_context, "mesh", None)
    if mesh is None:
        return ()
    return tuple((n, int(mesh.shape[n])) for n in mesh.axis_names)


# The compiler params the ``tpu_custom_call`` takes as they are, under the same names.
_OPTIONS_AS_GIVEN = (
    "vmem_limit_bytes", "allow_input_fusion", "internal_scratch_in_bytes", "collective_id",
    "serialization_format", "disable_bounds_checks", "disable_semaphore_checks",
    "skip_device_barrier", "allow_collective_id_without_custom_barrier",
    "shape_invariant_numerics", "needs_layout_passes",
)


def custom_call_options(p: CompilerParams, cost_estimate, *, input_memory_spaces=None,
                        output_memory_spaces=None) -> dict:
    """The ``tpu_custom_call`` options that the compiler params and the cost estimate
    decide (every Mosaic kernel's, TensorCore or SparseCore); the memory spaces are the
    kernel's own (None: all default)."""
    return dict(
        {name: getattr(p, name) for name in _OPTIONS_AS_GIVEN},
        cost_estimate=cost_dict(cost_estimate),
        flags=p.flags_dict,
        output_memory_spaces=output_memory_spaces,
        input_memory_spaces=input_memory_spaces,
    )


def _config_kwargs(kernel, p: CompilerParams, cost_estimate) -> dict:
    """The options of the backend config, shared by the custom call and the emulator."""
    return custom_call_options(
        p, cost_estimate,
        output_memory_spaces=kernel.output_memory_spaces if any(
            kernel.output_memory_spaces) else None,
        input_memory_spaces=kernel.input_memory_spaces if any(
            kernel.input_memory_spaces) else None)


def _print_module(kernel, name: str) -> None:
    """``pallas_call(debug=True)``: the Mosaic module, after the kernel jaxpr the core
    prints (as upstream)."""
    print(f"The Mosaic module for pallas_call {name}:", file=sys.stdout)
    print(kernel.module, file=sys.stdout)


def backend_config(jaxpr, grid_mapping, compiler_params: CompilerParams, cost_estimate,
                   name: str, debug: bool = False) -> bytes:
    """The ``tpu_custom_call`` backend config (JSON carrying the serialised module) that
    :func:`lower_pallas_call` attaches, built by the same lowering and serialisation."""
    jaxpr, grid_mapping = physicalize(jaxpr, grid_mapping)  # typed keys: their key data
    kernel = build_module(jaxpr, grid_mapping, compiler_params, name)
    if debug:
        _print_module(kernel, name)
    cfg = jc.backend_config_of(kernel.module,
                               **_config_kwargs(kernel, compiler_params, cost_estimate))
    return cfg.to_json()


def lower_pallas_call(ctx, *in_nodes, jaxpr, grid_mapping, compiler_params: CompilerParams,
                      cost_estimate, name, metadata, out_avals, grid_bounds=(),
                      debug=False):
    """The ``tpu_custom_call``; ``grid_bounds`` (the dynamic grid sizes, i32 scalars)
    are its first operands, as Mosaic reads dynamic ``iteration_bounds``."""
    # Typed PRNG keys are their key data, in the kernel and across the call.
    jaxpr, gm = physicalize(jaxpr, grid_mapping)
    out_avals = physical_avals(out_avals)
    ctx = ctx.replace(avals_in=physical_avals(ctx.avals_in),
                      avals_out=physical_avals(ctx.avals_out))
    kernel = build_module(jaxpr, gm, compiler_params, name, mesh_axes=mesh_axes_of(ctx),
                          ir_version=jc.mosaic_ir_version(ctx))
    if debug:
        _print_module(kernel, name)
    p = compiler_params
    nb = len(grid_bounds)
    config = _config_kwargs(kernel, p, cost_estimate)
    with kernel.context:  # how the TPU runtime specialises symbolic dimensions, if any
        annotate(kernel.module, kernel.placeholders, ctx.avals_in,
                 tuple(gm.grid_bound_dims) or (None,) * nb)
    if nb and config["input_memory_spaces"] is not None:
        config["input_memory_spaces"] = (None,) * nb + tuple(config["input_memory_spaces"])
    # Bool (f16) operands cross the call as int32 (f32), what their refs hold
    # (T.memory_dtype).
    in_avals = ctx.avals_in[nb:]
    in_nodes = [jc.convert_hlo(ctx, x, a, _in_memory(a)) if _is_bool(a) else x
                for x, a in zip(in_nodes, in_avals)]
    outs = jc.lower_module_to_custom_call(
        ctx, *grid_bounds, *in_nodes,
        module=kernel.module,
        out_type=tuple(_in_memory(a) for a in out_avals),
        kernel_name=name.split(" ")[0],
        input_output_aliases=tuple((i + nb, o) for i, o in gm.input_output_aliases),
        has_side_effects=side_effect_type(p.has_side_effects),
        metadata=dict(metadata) if metadata else None,
        **config,
    )
    return [jc.convert_hlo(ctx, o, _in_memory(a), a) if _is_bool(a) else o
            for o, a in zip(outs, out_avals)]


def physical_avals(avals) -> list:
    """``avals`` as they cross the custom call: a typed PRNG key as its key data."""
    return [jc.physical_aval(a) for a in avals]


def _is_bool(aval) -> bool:
    """Whether ``aval`` crosses the call as another dtype (bool, float16)."""
    return is_widened(aval.dtype)


def _in_memory(aval):
    """``aval`` as the kernel's memory holds it (bools as int32, float16 as float32)."""
    return aval.update(dtype=memory_dtype(aval.dtype)) if _is_bool(aval) else aval
