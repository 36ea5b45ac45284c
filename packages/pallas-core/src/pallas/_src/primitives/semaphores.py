"""Counting semaphores: ``semaphore_signal``, ``semaphore_wait``, ``semaphore_read``.

Semaphores are int32 buffers in a semaphore memory space. In the interpreter a signal
adds to the count and a wait subtracts; a wait that would block forever (the count is
too small and nothing else runs concurrently) is reported as a deadlock when debug
checks are on.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter import views
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.primitives.effectful import effect_primitive
from pallas._src.primitives.load_store import _ref_and_transforms
from pallas._src.primitives.pretty import RefAccess, register_ref_access_printer, transforms_of

semaphore_signal_p = effect_primitive("semaphore_signal", {jc.WriteEffect(0)})
semaphore_wait_p = effect_primitive("semaphore_wait", {jc.WriteEffect(0)})
semaphore_read_p = jc.Primitive("semaphore_read")


class DeviceIdType(enum.Enum):
    """How a ``device_id`` names a device: by mesh coordinates or by logical id."""

    MESH = "mesh"
    LOGICAL = "logical"


def _flat(sem):
    base, transforms = _ref_and_transforms(sem)
    flat, tree = jax.tree_util.tree_flatten(transforms)
    return base, flat, tree


def semaphore_signal(sem_or_view, inc=1, *, device_id=None,
                     device_id_type: DeviceIdType = DeviceIdType.MESH, core_index=None):
    """Adds ``inc`` to a semaphore (on ``device_id``'s copy, when given)."""
    base, flat, tree = _flat(sem_or_view)
    dev_flat, dev_tree = jax.tree_util.tree_flatten(device_id)
    core = [] if core_index is None else [jnp.asarray(core_index, jnp.int32)]
    semaphore_signal_p.bind(
        base, *flat, jnp.asarray(inc, jnp.int32), *dev_flat, *core, tree=tree,
        device_id_tree=dev_tree, device_id_type=device_id_type, has_core=bool(core),
    )


def semaphore_wait(sem_or_view, value=1, *, decrement: bool = True):
    """Waits until a semaphore reaches ``value``; then subtracts it if ``decrement``."""
    base, flat, tree = _flat(sem_or_view)
    semaphore_wait_p.bind(base, *flat, jnp.asarray(value, jnp.int32), tree=tree,
                          decrement=decrement)


def semaphore_read(sem_or_view):
    """The current count of a semaphore (an int32 scalar)."""
    base, flat, tree = _flat(sem_or_view)
    return semaphore_read_p.bind(base, *flat, tree=tree)


semaphore_read_p.def_effectful_abstract_eval(
    lambda *a, **k: (jc.ShapedArray((), jnp.int32), {jc.ReadEffect(0)})
)


def _semaphore_access(eqn) -> RefAccess:
    """The semaphore (view) and the rest (count, device ids, core index) as operands."""
    transforms, end = transforms_of(eqn, 1, eqn.params["tree"])
    return RefAccess(eqn.invars[0], transforms, eqn.invars[end:])


# `semaphore_wait a[1] v`, `c = semaphore_read a[...]`
for _prim in (semaphore_wait_p, semaphore_read_p):
    register_ref_access_printer(_prim, "op", _semaphore_access,
                                hidden=("tree", "device_id_tree", "has_core"))


def _pp_device_id(tree, leaves: list, context):
    """A device id as it was written: ``b``, ``(b, c)``, ``{x: b}``, ``{x: (b, c)}``."""
    docs = iter([jc.pp_var(v, context) for v in leaves])
    marker = object()
    shaped = jax.tree_util.tree_unflatten(tree, [marker] * tree.num_leaves)

    def doc(x):
        if x is marker:
            return next(docs)
        if isinstance(x, dict):
            items = [jc.pp.concat([jc.pp.text(f"{k}: "), doc(v)]) for k, v in x.items()]
            return jc.pp.concat([jc.pp.text("{"), jc.pp.join(jc.pp.text(", "), items),
                                 jc.pp.text("}")])
        if isinstance(x, (tuple, list)):
            return jc.pp.concat([jc.pp.text("("), jc.pp.join(jc.pp.text(", "),
                                                                [doc(v) for v in x]),
                                 jc.pp.text(")")])
        return jc.pp.text(str(x))

    return doc(shaped)


def _pp_signal(eqn, context, settings):
    """`semaphore_signal a[1] inc`, then the device id as written (`{x: b}`, `(b, c)`)
    and `core=c`; a logical device id is marked `logical`."""
    p = eqn.params
    transforms, end = transforms_of(eqn, 1, p["tree"])
    rest = list(eqn.invars[end:])
    inc, rest = rest[0], rest[1:]
    parts = [jc.pp.text("semaphore_signal "),
             jc.pp_ref_transforms(context, eqn.invars[0], tuple(transforms or ())),
             jc.pp.text(" "), jc.pp_var(inc, context)]
    dev_tree = p["device_id_tree"]
    if dev_tree is not None and dev_tree.num_leaves:
        n = dev_tree.num_leaves
        parts += [jc.pp.text(" "), _pp_device_id(dev_tree, rest[:n], context)]
        rest = rest[n:]
        if p["device_id_type"] is not DeviceIdType.MESH:
            parts.append(jc.pp.text(f" {p['device_id_type'].value}"))
    if p["has_core"]:
        parts += [jc.pp.text(" core="), jc.pp_var(rest[0], context)]
    return jc.pp.concat(parts)


jc.pp_eqn_rules[semaphore_signal_p] = _pp_signal


def _view(cell, idx, tree):
    return views.read_flat(cell.value, idx, tree)


def _update(cell, idx, tree, new):
    _, cell.value = views.swap_flat(cell.value, new, idx, tree)


def _count_operands(eqn, invals):
    """A signal's or wait's operands: (the semaphore's cell, its index operands, the
    count signalled or awaited, the operands after it)."""
    cell, *rest = invals
    n = eqn.params["tree"].num_leaves
    return cell, rest[:n], rest[n], rest[n + 1:]


@register_interpret_rule(semaphore_signal_p)
def _signal_rule(ctx, eqn, invals):
    p = eqn.params
    cell, idx, inc, rest = _count_operands(eqn, invals)
    if p["device_id_tree"].num_leaves:
        signal_remote = ctx.backend_state.get("remote_semaphore_signal")
        if signal_remote is None:
            raise NotImplementedError(
                "semaphore_signal with device_id needs a multi-device interpreter "
                "(run the kernel under shard_map with a backend that provides remote "
                "semaphores, e.g. pallas-tpu)"
            )
        devs = rest[: p["device_id_tree"].num_leaves]
        signal_remote(ctx, cell, idx, p["tree"], inc, devs, p["device_id_type"])
        return []
    _update(cell, idx, p["tree"], _view(cell, idx, p["tree"]) + inc)
    return []


@register_interpret_rule(semaphore_wait_p)
def _wait_rule(ctx, eqn, invals):
    p = eqn.params
    cell, idx, value, _ = _count_operands(eqn, invals)
    cur = _view(cell, idx, p["tree"])
    ctx.report(
        jnp.all(cur >= value),
        f"semaphore_wait on {cell.origin} would block forever: its count is below the "
        f"awaited value and nothing else runs concurrently in the interpreter",
    )
    if p["decrement"]:
        _update(cell, idx, p["tree"], cur - value)
    return []


@register_interpret_rule(semaphore_read_p)
def _read_rule(ctx, eqn, invals):
    cell, *idx = invals
    return [_view(cell, idx, eqn.params["tree"])]
