"""Every private JAX import of pallas-tpu-sparsecore, in one place.

Porting to a new JAX release should be a change to this file (and the pin in
``pyproject.toml``) alone. What we take from JAX is not Pallas: effects, jaxpr tracing, and
the Mosaic custom-call packaging's tiling option for SparseCore. The state (Ref) types and
primitives are pallas-core's (``pallas.state``), re-exported here for this package.
"""

from __future__ import annotations

from jax._src import config as _config
from jax._src import core, effects
from jax._src import linear_util as lu
from jax._src import tpu_custom_call as _tcc
from jax._src.interpreters import partial_eval as pe

from pallas.state import *  # noqa: F403 - pallas-core's Ref types and primitives, re-exported
from pallas.state import TransformedRef, transform_type

Primitive = core.Primitive
ShapedArray = core.ShapedArray
Literal = core.Literal
Var = core.Var
control_flow_allowed_effects = effects.control_flow_allowed_effects
lowerable_effects = effects.lowerable_effects
Effect = core.Effect
JaxprInputEffect = effects.JaxprInputEffect
positional_effects = core.positional_effects
convert_constvars_jaxpr = pe.convert_constvars_jaxpr

# Folds operations on concrete values while tracing (the subcore model evaluates what
# depends only on the subcore's index eagerly, so control flow around barriers is known).
eager_constant_folding = _config.eager_constant_folding

# The SparseCore memory tiling of the Mosaic custom call (unless TC tiling is asked for).
SPARSE_CORE_TILING = _tcc.Tiling.SPARSE_CORE


def ref_and_transforms(ref):
    """(the underlying ref, its list of transforms) of a ref or ``ref.at[...]`` view."""
    if isinstance(ref, TransformedRef):
        return ref.ref, list(ref.transforms)
    return ref, []


def transformed_aval(ref_aval, transforms):
    """The aval of ``ref_aval`` seen through ``transforms``."""
    return transform_type(transforms, ref_aval)


def trace_to_jaxpr(fun, in_avals, debug_name: str):
    """Traces ``fun`` (flat in, flat out) to (jaxpr, out_avals, consts)."""
    from jax._src import api_util

    dbg = api_util.debug_info(debug_name, fun, tuple(in_avals), {})
    return pe.trace_to_jaxpr_dynamic(lu.wrap_init(fun, debug_info=dbg), in_avals)


COMPACT_TILING = _tcc.Tiling.COMPACT


def lower_module_to_custom_call(ctx, *in_nodes, **kwargs):
    """Serialises a Mosaic module and emits the ``tpu_custom_call`` for it."""
    return _tcc.lower_module_to_custom_call(ctx, *in_nodes, **kwargs)


def backend_config_of(module, **kwargs):
    """The ``CustomCallBackendConfig`` JAX attaches for ``module`` (for inspection)."""
    return _tcc._lower_to_custom_call_config(module, **kwargs)
