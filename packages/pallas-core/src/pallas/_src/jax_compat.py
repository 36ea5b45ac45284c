"""Every private JAX import of pallas-core, in one place.

JAX's ``jax._src`` modules change between releases. Porting pallas-core to a new JAX
release should be a change to this file alone.
"""

from __future__ import annotations

from jax._src import (
    ad_checkpoint,
    api_util,
    config,
    core,
    custom_derivatives,
    debugging,
    dispatch,
    dtypes,
    effects,
    pjit,
    sharding_impls,
    source_info_util,
)
from jax._src import checkify as checkify_internal
from jax._src import linear_util as lu
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import parallel as lax_parallel
from jax._src.lax.control_flow import conditionals as lax_conditionals
from jax._src.lax.control_flow import loops as lax_loops
from jax._src.state import discharge as state_discharge
from jax._src.state import indexing as state_indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types
from jax._src.state import utils as state_utils

# Re-exported modules (used by other pallas-core modules as ``jc.<module>``).
__all__ = [
    "ad", "batching", "checkify_internal", "api_util", "config", "core", "dispatch", "dtypes", "effects", "lu", "mlir", "pe",
    "source_info_util", "state_discharge", "state_indexing", "state_primitives", "state_types",
]

AbstractRef = state_types.AbstractRef
TransformedRef = state_types.TransformedRef
RefEffect = state_types.RefEffect
ReadEffect = state_types.ReadEffect
WriteEffect = state_types.WriteEffect
AccumEffect = state_types.AccumEffect
NDIndexer = state_indexing.NDIndexer
Slice = state_indexing.Slice
ds = state_indexing.ds
# Refs a kernel allocates itself (jax.new_ref / jax.empty_ref) and their effect.
new_ref_p = core.ref_p
empty_ref_p = core.empty_ref_p
free_ref_p = core.free_ref_p
InternalMutableArrayEffect = core.InternalMutableArrayEffect
ReshapeTransform = state_types.ReshapeTransform  # ref.reshape(...)
BitcastTransform = state_types.BitcastTransform  # ref.bitcast(...)
transform_type = state_types.transform_type  # a ref aval seen through its transforms
state_bitcast = state_utils.bitcast  # an array as a ref.bitcast view shows it (TPU layout)
get_p = state_primitives.get_p
swap_p = state_primitives.swap_p
addupdate_p = state_primitives.addupdate_p
ShapedArray = core.ShapedArray
is_symbolic_dim = core.is_symbolic_dim  # a shape-polymorphic dimension (jax.export)
dimension_as_value = core.dimension_as_value  # a symbolic dimension as an array
ClosedJaxpr = core.ClosedJaxpr
Jaxpr = core.Jaxpr
Literal = core.Literal
Var = core.Var
Primitive = core.Primitive
cond_p = lax_conditionals.cond_p
add_any_p = ad.add_jaxvals_p  # JAX's tangent addition ("add_any")
jit_p = pjit.jit_p

while_p = lax_loops.while_p
scan_p = lax_loops.scan_p
closed_call_p = core.closed_call_p
custom_jvp_call_p = custom_derivatives.custom_jvp_call_p
custom_vjp_call_p = custom_derivatives.custom_vjp_call_p
remat_p = ad_checkpoint.remat_p
jax_debug_print_p = debugging.debug_print_p  # jax.debug.print (not pallas' debug_print_p)
debug_callback_p = debugging.debug_callback_p  # jax.debug.callback
axis_index_p = lax_parallel.axis_index_p
extend_axis_env_nd = core.extend_axis_env_nd

register_discharge_rule = state_discharge.register_discharge_rule
register_partial_discharge_rule = state_discharge.register_partial_discharge_rule
discharge_rules = state_discharge._discharge_rules
discharge_state = state_discharge.discharge_state
run_state_p = state_discharge.run_state_p


def trace_kernel_to_jaxpr(fun, in_avals, debug_name: str, arg_names=None):
    """Traces ``fun`` (flat args, flat outs) over ``in_avals`` into (jaxpr, out_avals, consts)."""
    dbg = api_util.debug_info(debug_name, fun, tuple(in_avals), {})
    if arg_names is not None:
        dbg = dbg._replace(arg_names=tuple(arg_names))
    wrapped = lu.wrap_init(fun, debug_info=dbg)
    jaxpr, out_avals, consts = pe.trace_to_jaxpr_dynamic(wrapped, in_avals)
    return jaxpr, out_avals, consts


def convert_constvars_jaxpr(jaxpr):
    return pe.convert_constvars_jaxpr(jaxpr)


def dce_jaxpr(jaxpr, used_outputs, instantiate=False):
    return pe.dce_jaxpr(jaxpr, used_outputs, instantiate)


def jaxpr_subcomp_lower_fun(fun, multiple_results=True):
    return mlir.lower_fun(fun, multiple_results=multiple_results)





def dispatch_apply_primitive(prim, *args, **params):
    """Runs a primitive eagerly by jit-compiling its lowering (JAX's default impl)."""
    return dispatch.apply_primitive(prim, *args, **params)


# pallas.fuser (pallas/_src/fuser/): tracing, DCE, state discharge, the PRNG and hijax
# primitives that block specs are pulled through.
from jax._src import hijax as _hijax  # noqa: E402
from jax._src.random import prng as _prng  # noqa: E402
from jax._src.random import threefry2x32 as _threefry2x32  # noqa: E402

shaped_abstractify = core.shaped_abstractify
typeof = core.typeof
flatten_fun = api_util.flatten_fun
flatten_fun_nokwargs = api_util.flatten_fun_nokwargs
resolve_kwargs = api_util.resolve_kwargs
trace_to_jaxpr_dynamic = pe.trace_to_jaxpr_dynamic
dce_jaxpr_consts = pe.dce_jaxpr_consts
partial_eval_jaxpr_custom = pe.partial_eval_jaxpr_custom
convert_invars_to_constvars = pe.convert_invars_to_constvars
eval_jaxpr = core.eval_jaxpr
new_jaxpr_eqn = core.new_jaxpr_eqn
random_bits_p = _prng.random_bits_p
random_wrap_p = _prng.random_wrap_p
random_fold_in_p = _prng.random_fold_in_p
random_seed_p = _prng.random_seed_p
random_split_p = _prng.random_split_p
threefry2x32_p = _threefry2x32.threefry2x32_p
random_bits = _prng.random_bits
random_fold_in = _prng.random_fold_in
call_hi_primitive_p = _hijax.call_hi_primitive_p
ExtendedDType = dtypes.ExtendedDType
extended_dtype = dtypes.extended
issubdtype = dtypes.issubdtype


# Transformation machinery (used by pallas/_src/transforms/).
not_mapped = None  # how batching marks an unbatched operand
primitive_batchers = batching.primitive_batchers
primitive_jvps = ad.primitive_jvps
primitive_transposes = ad.primitive_transposes
primitive_linearizations = ad.primitive_linearizations
jvp_jaxpr = ad.jvp_jaxpr
Zero = ad.Zero
UndefinedPrimal = ad.UndefinedPrimal
is_undefined_primal = ad.is_undefined_primal
instantiate_zeros = ad.instantiate_zeros
float0 = dtypes.float0
jaxpr_as_fun = core.jaxpr_as_fun
JaxprInputEffect = effects.JaxprInputEffect
NamedAxisEffect = core.NamedAxisEffect
checkify_error_checks = checkify_internal.error_checks
check_vma = config._check_vma  # context manager: shard_map's varying-axes type checks
pcast = lax_parallel.pcast
# Inside shard_map: casts operands to vary over the union of their manual axes (as JAX's
# own primitives do), so transposition knows where cotangents must be summed.
insert_pvary = core.auto_insert_reshard


def register_typecheck(prim, rule) -> None:
    """``rule(ctx_factory, *in_atoms, **params) -> (out_avals, effects)`` checks ``prim``
    when JAX type-checks a jaxpr (``jax_enable_checks``), instead of the default."""
    core.custom_typechecks[prim] = rule


def check_jaxpr(jaxpr) -> None:
    """JAX's type check of ``jaxpr`` (raises on an ill-typed jaxpr)."""
    core.check_jaxpr(jaxpr)


# Pretty-printing of jaxprs (pallas/_src/primitives/pretty.py): ref accesses print as
# `a[i]`, the way JAX prints its own state primitives.
from jax._src import pretty_printer as _pretty_printer  # noqa: E402

pp = _pretty_printer  # the pretty-printer's documents (text, concat, join)

pp_eqn_rules = core.pp_eqn_rules
pp_var = core.pp_var
pp_vars = core.pp_vars
pp_kv_pairs = core.pp_kv_pairs
DropVar = core.DropVar
pp_ref_transforms = state_primitives.pp_ref_transforms


def io_effect():
    """The effect of an unordered ``jax.experimental.io_callback`` (never DCE'd, allowed
    in control flow and under ``shard_map``)."""
    from jax._src import callback

    return callback._IOEffect


def emit_host_callback(ctx, fn, operands):
    """Emits a call of ``fn(*numpy operands) -> sequence of arrays`` on every device (under
    a fully manual ``shard_map``, once per device; otherwise once), as ``io_callback`` does
    but without placing the operands on a JAX device first: they reach ``fn`` as the
    numpy arrays XLA hands over."""
    from jax._src import callback

    sharding = callback._callback_op_sharding(ctx.module_context.axis_context, None,
                                              ctx.avals_out)
    # Typed PRNG keys cross the callback as their key data (what the MLIR values hold).
    avals_in = [core.physical_aval(a) for a in ctx.avals_in]
    avals_out = [core.physical_aval(a) for a in ctx.avals_out]
    results, _, _ = callback.emit_python_callback(
        ctx, fn, None, list(operands), avals_in, avals_out, has_side_effect=True,
        returns_token=False, sharding=sharding)
    return results


# Partitioning pallas_call under jit (pallas/_src/partitioning.py): the context a
# lowering runs in (a jit over several devices, or inside a manual partition).
ShardingContext = sharding_impls.ShardingContext
SPMDAxisContext = sharding_impls.SPMDAxisContext


def lowering_for_export(ctx) -> bool:
    """Whether ``ctx`` lowers for ``jax.export`` (whose modules take no partitioner
    callbacks)."""
    params = getattr(ctx.module_context, "lowering_parameters", None)
    return bool(getattr(params, "for_export", False))


def require_devices_during_lowering(prim) -> None:
    """Makes ``jit`` lower jaxprs holding ``prim`` with their devices (and mesh) known,
    as custom partitioning needs; lowering over an ``AbstractMesh`` alone is refused."""
    dispatch.prim_requires_devices_during_lowering.add(prim)

