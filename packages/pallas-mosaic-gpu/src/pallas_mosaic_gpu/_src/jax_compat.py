"""Every private JAX import of pallas-mosaic-gpu's primitives and interpret mode.

JAX's ``jax._src`` modules change between releases; porting to the next JAX is a change
to this file (and the pin in ``pyproject.toml``). What is taken here is not Pallas: the
state (Ref) types and their discharge rules (the common ones come from pallas-core's
``pallas.state``), effects, the MLIR lowering helper and source locations.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np
from jax._src import core, effects, pretty_printer, source_info_util
from jax._src import pjit as _pjit
from jax._src.interpreters import mlir
from jax._src.state import discharge as state_discharge
from jax._src.state import types as state_types

import pallas.plugins
from pallas.state import *  # noqa: F403 - pallas-core's Ref types and primitives, re-exported
from pallas.state import ReshapeTransform  # what ref.reshape(...) applies

# This module's own names; pallas.state's (AbstractRef, get_p, ...) come with the import above.
__all__ = [
    "GpuEffect", "Literal", "Primitive", "device_mesh", "pretty_printer", "ShapedArray", "core", "get_view",
    "gpu_effect", "mlir", "set_view", "source_site", "ref_type_aval_mappings", "reshard_p",
    "run_state_p", "uninitialized",
]

# -- state (Refs) beyond pallas.state --------------------------------------------------
# run_state's table of ref-like initial values (type -> (ref aval, initial value)).
ref_type_aval_mappings = state_types._ref_type_aval_mappings
uninitialized = state_types.uninitialized
run_state_p = state_discharge.run_state_p
# A sharding annotation JAX inserts under a mesh (jax.set_mesh); a no-op on a kernel's values.
reshard_p = _pjit.reshard_p
RefTransposer = getattr(state_types, "RefTransposer", None)
TransposeTransform = state_types.TransposeTransform


def _one(transform):
    leaves, tree = jax.tree_util.tree_flatten((transform,))
    return leaves, tree


def get_view(value, flat_transforms, tree):
    """The part of array ``value`` that a ref with these (flattened) transforms sees;
    ``transpose_ref`` views (which JAX's discharge does not apply) permute the dims."""
    for t in jax.tree_util.tree_unflatten(tree, flat_transforms):
        if isinstance(t, TransposeTransform):
            value = jax.numpy.transpose(value, t.permutation)
        else:
            value = state_discharge._get_discharge(value, *_one(t))
    return value


def set_view(value, new, flat_transforms, tree):
    """``value`` with the part seen through the transforms replaced by ``new``."""
    return _set(value, new, list(jax.tree_util.tree_unflatten(tree, flat_transforms)))


def _set(value, new, transforms):
    if not transforms:
        return jax.numpy.broadcast_to(new, value.shape).astype(value.dtype)
    t, rest = transforms[0], transforms[1:]
    if isinstance(t, ReshapeTransform):  # ref.reshape(...): a contiguous array's new shape
        return _set(value.reshape(t.shape), new, rest).reshape(value.shape)
    if isinstance(t, TransposeTransform):
        inner = _set(jax.numpy.transpose(value, t.permutation), new, rest)
        return jax.numpy.transpose(inner, np.argsort(t.permutation))
    leaves, one = _one(t)
    inner = _set(state_discharge._get_discharge(value, leaves, one), new, rest)
    _, out = state_discharge._swap_discharge(value, inner, leaves, one)
    return out


# -- core -------------------------------------------------------------------------------
Primitive = core.Primitive
ShapedArray = core.ShapedArray
Literal = core.Literal


class GpuEffect(effects.Effect):
    """An effect of Mosaic GPU primitives that touch no ref operand (fences, waits on
    asynchronous copies, register hints), so that they are never dropped or hoisted."""

    def __str__(self) -> str:
        return "MosaicGpu"


gpu_effect = GpuEffect()
# Not an effect of the pallas_call outside the kernel: an exported kernel must load
# where pallas-mosaic-gpu is not installed.
pallas.plugins.register_kernel_local_effect(GpuEffect)
for _allowed in (effects.control_flow_allowed_effects, effects.lowerable_effects,
                 effects.remat_allowed_effects, effects.custom_derivatives_allowed_effects):
    _allowed.add_type(GpuEffect)


def source_site(eqn) -> str:
    """``file:line (function)`` of the user code an equation comes from."""
    return source_info_util.summarize(eqn.source_info)


# The lowering's name for the same thing.
source_info_summary = source_site


# -- the concrete device mesh Mosaic GPU reads (for peer addresses) ----------------------


@contextlib.contextmanager
def device_mesh(mesh):
    """Makes ``mesh`` the current concrete mesh while a kernel is built during lowering
    (``jax.set_mesh`` refuses inside ``jit``; Mosaic GPU's ``as_gpu_kernel`` reads the
    device mesh from this context to address other devices' memory)."""
    from jax._src import config

    prev = config.device_context.swap_local(mesh)
    try:
        yield
    finally:
        config.device_context.set_local(prev)


# -- Mosaic GPU's custom-call lowering ---------------------------------------------------


def mosaic_gpu_custom_call(ctx, *args, module, out_types, input_output_aliases):
    """Emits the ``mosaic_gpu_v2`` custom call of ``module`` with XLA buffer aliases
    (input index, output index): Mosaic GPU's own lowering rule, whose primitive takes no
    aliases (its ``inout`` buffers are always the last operands)."""
    from jax.experimental.mosaic.gpu import core as mgpu_core

    return mgpu_core._mosaic_gpu_lowering_rule(
        ctx, *args, module=module, out_types=out_types, inout_types=(),
        input_output_aliases=tuple(input_output_aliases))
