"""Remote DMAs and remote semaphore signals in the interpreter, across a CPU mesh.

When a kernel runs under ``jax.shard_map`` (e.g. on CPU devices from
``--xla_force_host_platform_device_count``), every device interprets the same kernel in
lockstep. A remote copy is then simulated with collectives over the mesh's manual axes:
every device all-gathers (its source data, its target device, the destination and
semaphore indices), and each device applies the copies whose target is itself, adding
the copy's size in bytes to its receive semaphore. The send semaphore is signalled
locally at once (the copy is complete when it starts).

Every device must reach the copy's collectives at the same program point. A ``cond``
around remote operations (a device-dependent ``pl.when``) is therefore run predicated by
the interpreter (every device runs every branch, its writes masked to the branch it
takes): a copy or signal then reaches its target only from devices that take the
branch (``branch_taken``), and its delivery is written whatever branch the *target*
is in (``unpredicated``). Remote operations in a loop whose trip count differs between
devices are not supported.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas import DeviceIdType
from pallas.plugins import branch_taken, unpredicated
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.primitives import refs as R


def _mesh_axes() -> tuple[tuple[str, ...], tuple[int, ...]]:
    am = jax.sharding.get_abstract_mesh()
    names = tuple(getattr(am, "axis_names", ()) or ())
    manual = set(getattr(am, "manual_axes", ()) or ())
    keep = [i for i, n in enumerate(names) if n in manual]
    if not keep:
        raise NotImplementedError(
            "remote DMAs and remote semaphore signals in the Pallas interpreter (backend "
            "mosaic_tpu) need the kernel to run under jax.shard_map over a mesh of devices "
            "(e.g. CPU devices from --xla_force_host_platform_device_count)"
        )
    sizes = tuple(am.axis_sizes[i] for i in keep)
    return tuple(names[i] for i in keep), sizes


def _linear(coords, sizes):
    out = jnp.int32(0)
    for c, n in zip(coords, sizes):
        out = out * n + jnp.asarray(c, jnp.int32)
    return out


def _my_id(names, sizes):
    return _linear([lax.axis_index(n) for n in names], sizes)


def target_id(dev_leaves, dev_tree, device_id_type, names, sizes):
    """The row-major linear index (over the manual mesh axes) of the target device."""
    device_id = jax.tree_util.tree_unflatten(dev_tree, list(dev_leaves))
    if device_id_type == DeviceIdType.LOGICAL:
        return jnp.asarray(device_id, jnp.int32).reshape(())
    if isinstance(device_id, dict):
        coords = _dict_coords(device_id, names, sizes)
    elif isinstance(device_id, (tuple, list)):
        if len(device_id) != len(names):
            raise ValueError(
                f"device_id {device_id!r} has {len(device_id)} coordinates but the mesh has "
                f"axes {names}"
            )
        coords = list(device_id)
    else:
        if len(names) != 1:
            raise ValueError(f"a scalar mesh device_id needs a 1-D mesh; the mesh has {names}")
        coords = [device_id]
    return _linear(coords, sizes)


def _dict_coords(device_id: dict, names, sizes) -> list:
    """Mesh coordinates from ``{axis: index}``, where a key may be a tuple of axes (a
    joint axis, as ``lax.axis_index(("y", "x"))``: its index is row-major over them);
    axes not named keep this device's coordinate."""
    coords = {}
    for key, value in device_id.items():
        axes = key if isinstance(key, tuple) else (key,)
        if not all(a in names for a in axes):
            continue  # (not a device axis of this mesh, e.g. a core axis)
        v = jnp.asarray(value, jnp.int32)
        for a in reversed(axes):
            n = sizes[names.index(a)]
            coords[a], v = lax.rem(v, n), lax.div(v, n)
    return [coords[n] if n in coords else lax.axis_index(n) for n in names]


def _gather(x, names):
    return lax.all_gather(jnp.asarray(x), names if len(names) > 1 else names[0], tiled=False)


def _count(names, sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def remote_dma_start(ctx, eqn, invals):
    p = eqn.params
    end = R.spec_end(p["refs"])
    (src, s_flat, s_tree), (dst, d_flat, d_tree), (sem, m_flat, m_tree), src_sem = (
        R.unflatten(p["refs"], invals[:end]))
    names, sizes = _mesh_axes()
    me = _my_id(names, sizes)
    tgt = target_id(invals[end:], p["device_id_tree"], p["device_id_type"], names, sizes)
    data = jc.get_view(src.value, s_flat, s_tree)
    size = jnp.int32(R.nbytes(jax.typeof(data)))
    g_data = _gather(data, names)
    g_tgt = _gather(tgt, names)
    g_sent = _gather(branch_taken(), names)
    g_dst = [_gather(i, names) for i in d_flat]
    g_sem = [_gather(i, names) for i in m_flat]
    with unpredicated():
        for k in range(_count(names, sizes)):
            hit = jnp.logical_and(g_tgt[k] == me, g_sent[k])
            new_dst = jc.set_view(dst.value, g_data[k], [g[k] for g in g_dst], d_tree)
            dst.value = jnp.where(hit, new_dst, dst.value)
            idx = [g[k] for g in g_sem]
            cur = jc.get_view(sem.value, idx, m_tree)
            new_sem = jc.set_view(sem.value, cur + size, idx, m_tree)
            sem.value = jnp.where(hit, new_sem, sem.value)
    if src_sem is not None:
        c, f, t = src_sem
        c.value = jc.set_view(c.value, jc.get_view(c.value, f, t) + size, f, t)
    return []


def remote_semaphore_signal(ctx, eqn, invals, local_rule):
    p = eqn.params
    if p["device_id_tree"].num_leaves == 0:
        return local_rule(ctx, eqn, invals)
    cell, *rest = invals
    n = p["tree"].num_leaves
    idx, inc = rest[:n], rest[n]
    devs = rest[n + 1 : n + 1 + p["device_id_tree"].num_leaves]
    names, sizes = _mesh_axes()
    me = _my_id(names, sizes)
    tgt = target_id(devs, p["device_id_tree"], p["device_id_type"], names, sizes)
    g_tgt, g_inc = _gather(tgt, names), _gather(inc, names)
    g_sent = _gather(branch_taken(), names)
    g_idx = [_gather(i, names) for i in idx]
    with unpredicated():
        for k in range(_count(names, sizes)):
            hit = jnp.logical_and(g_tgt[k] == me, g_sent[k])
            kidx = [g[k] for g in g_idx]
            cur = jc.get_view(cell.value, kidx, p["tree"])
            new = jc.set_view(cell.value, cur + g_inc[k], kidx, p["tree"])
            cell.value = jnp.where(hit, new, cell.value)
    return []


def mesh_axis_index(ctx, eqn, invals, grid_rule):
    """``lax.axis_index(name)`` in a kernel: a grid axis (core's rule) or a mesh axis of
    the enclosing ``shard_map`` (bound as the collective it is)."""
    name = eqn.params["axis_name"]
    if name in (ctx.axis_names or ()):
        return grid_rule(ctx, eqn, invals)
    return [eqn.primitive.bind(*invals, **eqn.params)]
