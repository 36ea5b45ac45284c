"""Multi-device memory: ``multimem_store``, ``multimem_load_reduce`` and
``semaphore_signal_multicast``.

A GMEM ref of a kernel operand lives at the same place on every device of the
enclosing ``shard_map`` mesh (XLA allocates it in symmetric memory); these primitives
address that place on every device along ``collective_axes`` at once (NVLink
multicast): a store writes ``source`` into the ref on all of them, a load-reduce reads
it on all of them and combines the values, a multicast signal adds to a semaphore on
all of them. The ``mosaic_gpu`` lowering emits ``multimem.*`` instructions through
Mosaic GPU's collective metadata.

Interpreters: a kernel runs on one device at a time there, so these run only when the
collective axes have a single device (then they are the plain local store, load and
signal); with more, the interpreters refuse at trace time, naming the primitive.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp

from pallas.plugins import effect_primitive, is_semaphore_space
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.memory import SMEM
from pallas_mosaic_gpu._src.primitives import refs as R

REDUCTIONS = ("add", "min", "max", "and", "or", "xor")
_BITWISE = ("and", "or", "xor")


def _store_effects(source, *avals, refs, **_):
    return {jc.WriteEffect(refs[0][0] + 1)}


def _signal_effects(*avals, refs, **_):
    return {jc.WriteEffect(refs[0][0])}


multimem_store_p = effect_primitive("mgpu_multimem_store", _store_effects)
multimem_load_reduce_p = jc.Primitive("mgpu_multimem_load_reduce")
semaphore_signal_multicast_p = effect_primitive("mgpu_semaphore_signal_multicast",
                                                _signal_effects)
PRIMITIVES = (multimem_store_p, multimem_load_reduce_p, semaphore_signal_multicast_p)
NAMES = {multimem_store_p: "multimem_store", multimem_load_reduce_p: "multimem_load_reduce",
         semaphore_signal_multicast_p: "semaphore_signal_multicast"}


def _axes(fn: str, collective_axes: Any) -> tuple[tuple[Hashable, ...], int]:
    """``collective_axes`` as a tuple, and how many devices they span (they must be
    axes of an enclosing ``shard_map``)."""
    axes = collective_axes if isinstance(collective_axes, tuple) else (collective_axes,)
    if not axes or any(a is None for a in axes):
        raise ValueError(f"plgpu.{fn}(collective_axes={collective_axes!r}): name the mesh "
                         "axes (of the enclosing shard_map) to address devices along")
    try:
        size = int(jax.lax.axis_size(axes))
    except NameError as e:
        raise ValueError(
            f"plgpu.{fn}(collective_axes={collective_axes!r}): not axes of an enclosing "
            f"jax.shard_map ({e}); multimem addresses a kernel operand on every device of "
            "the mesh the kernel runs in") from None
    return axes, size


def _check_gmem_ref(fn: str, what: str, ref: Any) -> Any:
    base, _ = R.ref_and_transforms(ref)
    if not isinstance(jax.typeof(base), jc.AbstractRef):
        raise TypeError(f"plgpu.{fn}: {what} must be a GMEM ref (a kernel operand or "
                        f"output), got a value of type {jax.typeof(base).str_short()}")
    space = R.memory_space(ref)
    if space is SMEM or is_semaphore_space(space):
        raise TypeError(f"plgpu.{fn}: {what} must be a GMEM ref (a kernel operand or "
                        f"output, in symmetric memory), got a ref in {space}")
    return R.view_aval(ref)


def multimem_store(source: jax.Array, ref: Any, collective_axes: Any) -> None:
    """Stores ``source`` into ``ref`` on every device along ``collective_axes``."""
    aval = _check_gmem_ref("multimem_store", "ref", ref)
    source = jnp.asarray(source)
    if tuple(source.shape) != tuple(aval.shape) or source.dtype != aval.dtype:
        raise ValueError(
            f"plgpu.multimem_store: source is {jax.typeof(source).str_short()} but ref is "
            f"{aval.str_short()}; the value stored must have the ref's shape and dtype")
    axes, size = _axes("multimem_store", collective_axes)
    refs = R.FlatRefs(ref)
    multimem_store_p.bind(source, *refs.operands, refs=refs.spec, collective_axes=axes,
                          num_devices=size)


def multimem_load_reduce(ref: Any, *, collective_axes: Any, reduction_op: Any) -> jax.Array:
    """Reads ``ref`` on every device along ``collective_axes`` and combines the values
    with ``reduction_op`` (``"add"``, ``"min"``, ``"max"``; ``"and"``, ``"or"``,
    ``"xor"`` for integers)."""
    aval = _check_gmem_ref("multimem_load_reduce", "ref", ref)
    op = str(getattr(reduction_op, "value", reduction_op)).lower()
    if op not in REDUCTIONS:
        raise ValueError(f"plgpu.multimem_load_reduce(reduction_op={reduction_op!r}): must "
                         f"be one of {REDUCTIONS}")
    if op in _BITWISE and not jnp.issubdtype(aval.dtype, jnp.integer):
        raise TypeError(f"plgpu.multimem_load_reduce(reduction_op={op!r}): bitwise "
                        f"reductions take integer refs; ref is {aval.str_short()}")
    if not aval.shape:
        raise ValueError("plgpu.multimem_load_reduce: ref is a scalar; it reads an array "
                         "(a window of at least one dimension)")
    axes, size = _axes("multimem_load_reduce", collective_axes)
    refs = R.FlatRefs(ref)
    return multimem_load_reduce_p.bind(*refs.operands, refs=refs.spec, collective_axes=axes,
                                       num_devices=size, reduction_op=op,
                                       out_aval=jc.ShapedArray(aval.shape, aval.dtype))


def semaphore_signal_multicast(semaphore: Any, value: int | jax.Array = 1, *,
                               collective_axes: Any) -> None:
    """Adds ``value`` to ``semaphore`` on every device along ``collective_axes``."""
    base, _ = R.ref_and_transforms(semaphore)
    aval = jax.typeof(base)
    if not (isinstance(aval, jc.AbstractRef) and is_semaphore_space(
            getattr(aval, "memory_space", None))):
        raise TypeError("plgpu.semaphore_signal_multicast: semaphore must be a semaphore "
                        "ref (plgpu.SemaphoreType.REGULAR scratch or pl.get_global), got "
                        f"{aval.str_short()}")
    if R.view_aval(semaphore).shape:
        raise ValueError("plgpu.semaphore_signal_multicast: signal one semaphore; index "
                         f"the array of shape {R.view_aval(semaphore).shape} with .at[i]")
    value = jnp.asarray(value)
    if value.shape or not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError("plgpu.semaphore_signal_multicast(value=...): expected an integer "
                        f"scalar, got {jax.typeof(value).str_short()}")
    axes, size = _axes("semaphore_signal_multicast", collective_axes)
    refs = R.FlatRefs(semaphore)
    semaphore_signal_multicast_p.bind(*refs.operands, value.astype(jnp.int32),
                                      refs=refs.spec, collective_axes=axes,
                                      num_devices=size)


def _load_reduce_effects(*avals, refs, out_aval, **_):
    return out_aval, {jc.ReadEffect(refs[0][0])}


multimem_load_reduce_p.def_effectful_abstract_eval(_load_reduce_effects)


def check_single_device(eqn) -> None:
    """The interpreters' refusal of multimem across several devices (each device's
    kernel runs on its own there, with no memory shared between them)."""
    if eqn.primitive in NAMES and eqn.params["num_devices"] > 1:
        raise NotImplementedError(
            f"plgpu.{NAMES[eqn.primitive]}(collective_axes="
            f"{eqn.params['collective_axes']!r}) across {eqn.params['num_devices']} "
            "devices: pallas-mosaic-gpu's interpreters run each device's kernel on its "
            "own and do not simulate multicast memory yet; backend 'mosaic_gpu' lowers "
            "and compiles it (interpret=False)")


# -- reference interpreter rules (one device: the plain local store/load/signal) --------


def _store_rule(ctx, eqn, invals):
    check_single_device(eqn)
    source, *rest = invals
    ((cell, flat, tree),) = R.unflatten(eqn.params["refs"], rest)
    cell.value = jc.set_view(cell.value, source, flat, tree)
    if getattr(cell, "init", None) is not None:
        cell.init = jc.set_view(cell.init, jnp.ones(jnp.shape(source), jnp.bool_), flat, tree)
    return []


def _load_reduce_rule(ctx, eqn, invals):
    check_single_device(eqn)
    ((cell, flat, tree),) = R.unflatten(eqn.params["refs"], invals)
    return jc.get_view(cell.value, flat, tree)


def _signal_rule(ctx, eqn, invals):
    check_single_device(eqn)
    spec = eqn.params["refs"]
    ((cell, flat, tree),) = R.unflatten(spec, invals)
    inc = invals[R.spec_end(spec)]
    cell.value = jc.set_view(cell.value, jc.get_view(cell.value, flat, tree) + inc, flat,
                             tree)
    return []


INTERPRET_RULES = {multimem_store_p: _store_rule, multimem_load_reduce_p: _load_reduce_rule,
                   semaphore_signal_multicast_p: _signal_rule}
