"""Every private JAX import of pallas-tpu, in one place.

JAX's ``jax._src`` modules change between releases. Porting pallas-tpu to a new JAX
release should be a change to this file (and the pin in ``pyproject.toml``) alone.

What we take from JAX here is not Pallas: the Mosaic TPU custom-call packaging
(``jax._src.tpu_custom_call``), the MLIR lowering machinery, the state (Ref) types beyond
pallas-core's ``pallas.state``, and tracing to jaxprs.
"""

from __future__ import annotations

import contextlib

from jax._src import core, dtypes, effects, source_info_util
from jax._src import linear_util as lu
from jax._src import pjit as _pjit
from jax._src import tpu_custom_call as _tcc
from jax._src.interpreters import batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.state import types as state_types

from pallas import plugins  # reads and writes through ref views (indexers, reshapes, bitcasts)
from pallas.state import *  # noqa: F403 - pallas-core's Ref types and primitives, re-exported

# This module's own names; pallas.state's (AbstractRef, get_p, ...) come with the import above.
__all__ = [
    "ClosedJaxpr", "batching", "Literal", "Primitive", "ShapedArray", "Var", "core",
    "dtypes", "effects", "get_view", "lower_module_to_custom_call", "make_ir_context",
    "mlir", "set_view", "blocked_fold_in", "blocked_sample_block", "reshard_p",
    "trace_to_jaxpr",
]

# A sharding annotation JAX inserts under a mesh (jax.set_mesh); a no-op on a kernel's values.
reshard_p = _pjit.reshard_p

# -- state (Refs) beyond pallas.state --------------------------------------------------
RefBitcaster = getattr(state_types, "RefBitcaster", None)
RefReshaper = getattr(state_types, "RefReshaper", None)
from jax._src.state import primitives as _state_primitives  # noqa: E402

# Refs a kernel allocates with jax.empty_ref (scratch until the kernel ends).
empty_ref_p = core.empty_ref_p
# Pretty-printing of jaxprs (a DMA prints as upstream's ``dma_start(p0) src -> dst sem``).
from jax._src import pretty_printer as pp  # noqa: E402, F401 (jc.pp)

pp_eqn_rules = core.pp_eqn_rules
pp_eqn_generic = core._pp_eqn  # the printing of an equation without its custom rule
pp_ref_transforms = _state_primitives.pp_ref_transforms

# Shape polymorphism: the variables of symbolic dimensions, and a dimension as a value.
from jax._src.export import shape_poly as _shape_poly  # noqa: E402

all_dim_vars = _shape_poly.all_dim_vars
dim_as_value_p = _shape_poly.dim_as_value_p

# jnp.tile's, jnp.stack's and jnp.unstack's primitives (not in jax.extend.core.primitives).
from jax._src.lax import lax as _lax  # noqa: E402

tile_p = _lax.tile_p
stack_p = _lax.stack_p  # jnp.stack
unstack_p = _lax.unstack_p  # jnp.unstack


def get_view(value, flat_transforms, tree):
    """The part of array ``value`` that a ref with these (flattened) transforms sees."""
    return plugins.read_view(value, flat_transforms, tree)


def add_view(value, new, flat_transforms, tree):
    """``value`` with ``new`` added to the part seen through the transforms; repeated
    array indices each add their contribution."""
    return plugins.add_view(value, new, flat_transforms, tree)


def set_view(value, new, flat_transforms, tree):
    """``value`` with the part seen through the transforms replaced by ``new``."""
    _, out = plugins.swap_view(value, new, flat_transforms, tree)
    return out


# -- core ---------------------------------------------------------------------------------
Primitive = core.Primitive
ShapedArray = core.ShapedArray
ClosedJaxpr = core.ClosedJaxpr
Literal = core.Literal
Var = core.Var


def trace_to_jaxpr(fun, in_avals, debug_name: str):
    """Traces ``fun`` (flat in, flat out) to (jaxpr, out_avals, consts)."""
    from jax._src import api_util

    dbg = api_util.debug_info(debug_name, fun, tuple(in_avals), {})
    jaxpr, out_avals, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(fun, debug_info=dbg),
                                                         in_avals)
    return jaxpr, out_avals, consts


# -- MLIR and the Mosaic custom call ------------------------------------------------------
make_ir_context = mlir.make_ir_context
TpuSideEffectType = _tcc.TpuSideEffectType
CustomCallMemorySpace = _tcc.MemorySpace
CostEstimateDict = _tcc.CostEstimate


def lower_module_to_custom_call(ctx, *in_nodes, **kwargs):
    """Serialises a Mosaic module and emits the ``tpu_custom_call`` for it."""
    return _tcc.lower_module_to_custom_call(ctx, *in_nodes, **kwargs)


def convert_hlo(ctx, x, aval_in, aval_out):
    """HLO's convert (a cast to bool is ``x != 0``)."""
    return mlir.convert_hlo(ctx, x, aval_in, aval_out)


def mosaic_ir_version(ctx) -> int | None:
    """The Mosaic serialization version JAX writes the module of this lowering in (an
    older one without a TPU backend or for export; None: the latest)."""
    return _tcc.get_ir_version(ctx)


def backend_config_of(module, **kwargs):
    """The ``CustomCallBackendConfig`` JAX would attach for ``module`` (for inspection)."""
    return _tcc._lower_to_custom_call_config(module, **kwargs)


def source_info_summary(eqn) -> str:
    return source_info_util.summarize(eqn.source_info)


def user_source_location(eqn) -> str:
    """``file:line (function)`` of the innermost frame of ``eqn``'s traceback outside JAX
    and the Pallas packages: the kernel source line an equation comes from."""
    import os

    import jax

    import pallas

    skip = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, pallas))
    skip += (os.path.dirname(os.path.dirname(__file__)) + os.sep,)
    tb = eqn.source_info.traceback
    frames = getattr(tb, "frames", None) if tb is not None else None
    for f in frames or ():
        if not f.file_name.startswith(skip):
            return f"{f.file_name}:{f.line_num} ({f.function_name})"
    return source_info_summary(eqn)


# -- block-invariant sampling (JAX's non-Pallas helper for tile-by-tile PRNG keys) -------
def blocked_fold_in(global_key, total_size, block_size, tile_size, block_index):
    from jax._src import blocked_sampler

    return blocked_sampler.blocked_fold_in(global_key, total_size, block_size, tile_size,
                                           block_index)


def blocked_sample_block(sampler_fn, keys, block_size, tile_size, **kwargs):
    from jax._src import blocked_sampler

    return blocked_sampler.sample_block(sampler_fn, keys, block_size, tile_size, **kwargs)


def mark_ref_allocating(prim) -> None:
    """Marks ``prim`` as creating a ref inside a jaxpr (as JAX's own ``ref_p``): effects
    of later primitives on its result then need no corresponding jaxpr input (JAX's
    type check, under ``jax_enable_checks``, reads both flags)."""
    prim.ref_allocating = True
    prim.ref_primitive = True


# -- TPU interpret mode: control-flow primitives the simulation evaluates itself ----------
def control_flow_primitives() -> dict:
    """JAX's control-flow and call primitives, by role (the simulation runs their bodies
    eagerly, so that a semaphore wait inside a loop can block its core's thread)."""
    from jax._src import ad_checkpoint, custom_derivatives, pjit
    from jax._src.lax.control_flow import conditionals, loops

    return {
        "cond": conditionals.cond_p, "while": loops.while_p, "scan": loops.scan_p,
        "jit": pjit.jit_p, "closed_call": core.closed_call_p,
        "remat": ad_checkpoint.remat_p,
        "custom_jvp_call": custom_derivatives.custom_jvp_call_p,
        "custom_vjp_call": custom_derivatives.custom_vjp_call_p,
    }


def concrete_or_error(value, what: str):
    """``value`` as a Python constant, or JAX's ConcretizationTypeError naming ``what``."""
    return core.concrete_or_error(None, value, what)


def device_kind_of_abstract_mesh() -> str | None:
    """The device kind of the abstract mesh in context (``jax.sharding.use_abstract_mesh``)."""
    import jax

    am = jax.sharding.get_abstract_mesh()
    dev = getattr(am, "abstract_device", None)
    return getattr(dev, "device_kind", None) if dev is not None else None


def interpret_mode_config():
    """JAX's ``pallas_tpu_interpret_mode_context_manager`` config state: forced TPU
    interpret params, part of the jit cache key (so forcing the mode retraces)."""
    from jax._src import config

    return config.pallas_tpu_interpret_mode_context_manager


def no_abstract_mesh():
    """A context with no abstract mesh (eager computations while a ``shard_map`` body is
    being lowered)."""
    from jax._src import mesh as mesh_lib

    return mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh)


@contextlib.contextmanager
def no_mesh():
    """A context with neither an abstract nor a concrete mesh (``jax.set_mesh``): a
    kernel exported on its own for the compiler is one device's program."""
    from jax._src import mesh as mesh_lib
    from jax._src import sharding_impls

    with sharding_impls._internal_use_concrete_mesh(mesh_lib.empty_concrete_mesh), \
            mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh):
        yield

# -- PRNG key implementations (pltpu.to_pallas_key's "pallas_tpu" keys) --------------------
from jax._src.random import prng as _prng  # noqa: E402
from jax._src.random import threefry2x32 as _threefry2x32  # noqa: E402

PRNGImpl = _prng.PRNGImpl
prng_impls = _prng.prngs  # name -> PRNGImpl, what jax.random's impl= strings resolve to
register_prng = _prng.register_prng
threefry_apply_round = _threefry2x32.apply_round
KeyTy = _prng.KeyTy  # the dtype of typed keys of one PRNGImpl

# -- JAX's PRNG primitives, for lowering typed keys in kernels (lowering/keys.py) ----------
threefry2x32_p = _threefry2x32.threefry2x32_p
iota_2x32_shape_p = _prng.iota_2x32_shape_p
iota_2x32_shape = _prng.iota_2x32_shape
random_bits_p = _prng.random_bits_p
random_fold_in_p = _prng.random_fold_in_p
random_split_p = _prng.random_split_p
random_seed_p = _prng.random_seed_p
random_wrap_p = _prng.random_wrap_p
random_unwrap_p = _prng.random_unwrap_p
# The key-data-level implementations of the random primitives (over batched keys).
random_bits_impl_base = _prng.random_bits_impl_base
random_fold_in_impl_base = _prng.random_fold_in_impl_base
random_split_impl_base = _prng.random_split_impl_base
random_seed_impl_base = _prng.random_seed_impl_base
from jax._src import config as _config  # noqa: E402

threefry_partitionable = _config.threefry_partitionable  # .value: the flag in effect
physical_aval = core.physical_aval
from jax._src.interpreters.partial_eval import convert_constvars_jaxpr  # noqa: E402, F401
