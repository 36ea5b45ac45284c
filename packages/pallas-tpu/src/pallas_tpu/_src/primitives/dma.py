"""DMAs: ``make_async_copy``, ``async_copy``, ``sync_copy`` and their remote forms.

A DMA copies ``src_ref`` into ``dst_ref`` (both may be ``ref.at[...]`` views, in any
memory space) and signals a DMA semaphore when done; ``wait()`` blocks until the
semaphore has been signalled for a copy of the destination's size, then consumes it.

Interpreter semantics (``interpret=True``): ``start()`` performs the copy at once and
adds the copy's size in bytes to the semaphore; ``wait()`` subtracts the size of the
destination view, reporting (under ``pl.enable_debug_checks``) a wait that would block
forever. This is the "DMA completes at start" schedule: correct kernels give the same
numbers under any schedule.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import jax.numpy as jnp

from pallas import DeviceIdType
from pallas.plugins import effect_primitive, read_cell, write_cell
from pallas_tpu._src import core_compat as cc
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.memory import SemaphoreType, canonical_space
from pallas_tpu._src.primitives import dma_indexed as DI
from pallas_tpu._src.primitives import dma_run_time_size as RT
from pallas_tpu._src.primitives import refs as R
from pallas_tpu._src.primitives.remote import remote_dma_start

_log = logging.getLogger("pallas_tpu")


def _start_effects(*avals, refs, device_id_tree, device_id_type, priority, add):
    src, dst, dst_sem, src_sem = refs
    effects = {jc.ReadEffect(src[0]), jc.WriteEffect(dst[0]), jc.WriteEffect(dst_sem[0])}
    if src_sem is not None:
        effects.add(jc.WriteEffect(src_sem[0]))
    return effects


def _wait_effects(*avals, refs, device_id_tree, device_id_type, kind):
    sem = refs[0]
    return {jc.WriteEffect(sem[0])}


dma_start_p = effect_primitive("tpu_dma_start", _start_effects)
dma_wait_p = effect_primitive("tpu_dma_wait", _wait_effects)


def _check_copy(src_ref, dst_ref, what: str) -> None:
    _check_views(R.view_aval(src_ref), R.view_aval(dst_ref), what)


def check_copy_eqn(eqn, what: str = "async_copy") -> None:
    """The check of :func:`_check_copy` on a ``dma_start`` equation, where the copy runs
    or lowers: descriptors are made freely (upstream traces and prints a DMA between
    refs of different shapes or dtypes), a DMA that moves them fails."""
    avals = [v.aval for v in eqn.invars]
    views = []
    for pos, n, tree in eqn.params["refs"][:2]:
        views.append(R.view_aval_from(avals[pos], avals[pos + 1:pos + 1 + n], tree))
    _check_views(*views, what)


def _check_views(src, dst, what: str) -> None:
    if not _same_shape(src.shape, dst.shape) or src.dtype != dst.dtype:
        raise ValueError(
            f"{what}: the source ({src.str_short()}) and destination ({dst.str_short()}) "
            f"of a DMA must have the same shape and dtype"
        )


def _same_shape(a, b) -> bool:
    """Whether two view shapes may agree: static sizes must be equal; a size traced by
    ``pl.ds(start, traced_size)`` is checked by the simulation when the DMA runs."""
    if len(a) != len(b):
        return False
    return all(x is y or not (isinstance(x, int) and isinstance(y, int)) or x == y
               for x, y in zip(a, b))


def _check_semaphore(sem, verb: str) -> None:
    """A DMA signals, and its wait consumes, one DMA semaphore (as upstream: a ValueError
    at trace time otherwise)."""
    if not isinstance(sem, (jax.core.Tracer, jc.TransformedRef)):
        return
    aval = R.view_aval(sem)
    if aval.shape != ():
        raise ValueError(
            f"Cannot {verb} a DMA semaphore view of shape {aval.shape}: a DMA uses one "
            f"semaphore; index the semaphore array (sem.at[i])")
    base, _ = R.ref_and_transforms(sem)
    space = getattr(jax.typeof(base), "memory_space", None)
    try:
        kind = canonical_space(space)
    except ValueError:
        return
    if verb == "wait on" and kind is SemaphoreType.REGULAR:
        raise ValueError(
            "Cannot wait on a REGULAR semaphore with a DMA wait: a DMA signals a "
            "pltpu.SemaphoreType.DMA semaphore; wait on a REGULAR semaphore with "
            "pl.semaphore_wait")


def _flat_device_id(device_id):
    if device_id is None:
        return [], None
    leaves, tree = jax.tree_util.tree_flatten(device_id)
    return [jnp.asarray(d, jnp.int32) for d in leaves], tree


@dataclasses.dataclass
class AsyncCopyDescriptor:
    """A DMA that can be started and waited on (returned by ``make_async_copy``)."""

    src_ref: Any
    dst_ref: Any
    dst_sem: Any
    src_sem: Any = None
    device_id: Any = None
    device_id_type: DeviceIdType = DeviceIdType.MESH
    priority: int = 0
    add: bool = False
    # Made by make_async_copy/make_async_remote_copy and not yet started or waited for:
    # dropped so, it is reported (as upstream), a copy the kernel meant to make.
    unused: bool = dataclasses.field(default=False, repr=False, compare=False)

    @property
    def is_remote(self) -> bool:
        return self.src_sem is not None or self.device_id is not None

    def __del__(self):
        if self.unused:
            try:
                _log.error(
                    "AsyncCopyDescriptor was not used: a DMA from %s to %s made with "
                    "make_async_copy was never started or waited for (call .start() "
                    "and .wait())", _describe(self.src_ref), _describe(self.dst_ref))
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def _selected(self, run) -> bool:
        """If an operand is a ``pl.select_ref``, runs ``run(descriptor)`` for each
        option, under ``pl.when`` of the index picking it (the same ``pl.when`` nest
        for ``start`` and ``wait``), and says so."""
        for field in ("src_ref", "dst_ref", "dst_sem", "src_sem"):
            sel = getattr(self, field)
            if isinstance(sel, cc.SelectedRef):
                self.unused = False
                sel.dispatch(lambda ref, field=field: run(dataclasses.replace(self, **{field: ref})))
                return True
        return False

    def start(self, priority: int | None = None) -> None:
        """Starts the copy."""
        self.unused = False
        if self._selected(lambda d: d.start(priority)):
            return
        _check_semaphore(self.dst_sem, "signal")
        if self.src_sem is not None:
            _check_semaphore(self.src_sem, "signal")
        prio = self.priority if priority is None else int(priority)
        refs = R.FlatRefs(self.src_ref, self.dst_ref, self.dst_sem, self.src_sem)
        dev, dev_tree = _flat_device_id(self.device_id)
        dma_start_p.bind(
            *refs.operands, *dev, refs=refs.spec, device_id_tree=dev_tree,
            device_id_type=self.device_id_type, priority=prio, add=bool(self.add),
        )

    def _wait(self, sem, kind: str) -> None:
        self.unused = False
        if self._selected(lambda d: d._wait(d.dst_sem if kind == "recv" else d.src_sem,
                                            kind)):
            return
        _check_semaphore(sem, "wait on")
        refs = R.FlatRefs(sem, self.src_ref, self.dst_ref)
        dev, dev_tree = ([], None)
        if kind == "send":
            dev, dev_tree = _flat_device_id(self.device_id)
        dma_wait_p.bind(*refs.operands, *dev, refs=refs.spec, device_id_tree=dev_tree,
                        device_id_type=self.device_id_type, kind=kind)

    def wait(self) -> None:
        """Waits for the copy to land in ``dst_ref`` (and, if remote, to leave ``src_ref``)."""
        if self.src_sem is not None:
            self.wait_send()
        self.wait_recv()

    def wait_recv(self) -> None:
        """Waits until the data has arrived (signals on the destination semaphore)."""
        self._wait(self.dst_sem, "recv")

    def wait_send(self) -> None:
        """Waits until the data has left the source (remote copies only)."""
        if self.src_sem is None:
            raise ValueError("wait_send() needs a remote copy (make_async_remote_copy)")
        self._wait(self.src_sem, "send")


def make_async_copy(src_ref, dst_ref, sem) -> AsyncCopyDescriptor:
    """A DMA from ``src_ref`` to ``dst_ref`` signalling ``sem``; call ``.start()``/``.wait()``."""
    return AsyncCopyDescriptor(src_ref, dst_ref, sem, unused=True)


def _describe(ref) -> str:
    try:
        return R.view_aval(ref).str_short()
    except Exception:  # noqa: BLE001 - only for the message
        return type(ref).__name__


def async_copy(src_ref, dst_ref, sem, *, priority: int = 0,
               add: bool = False) -> AsyncCopyDescriptor:
    """Starts a DMA at once and returns its descriptor (``add=True`` accumulates)."""
    desc = AsyncCopyDescriptor(src_ref, dst_ref, sem, priority=priority, add=add)
    desc.start()
    return desc


def sync_copy(src_ref, dst_ref, *, add: bool = False) -> None:
    """Copies ``src_ref`` to ``dst_ref`` and waits for it (with a scoped DMA semaphore).

    Either may be a pytree of refs (the other of the same structure): every copy starts,
    then every one is waited for, on one semaphore; an empty pytree copies nothing.
    """
    from pallas import run_scoped

    srcs, src_tree = jax.tree_util.tree_flatten(src_ref)
    dsts, dst_tree = jax.tree_util.tree_flatten(dst_ref)
    if src_tree != dst_tree:
        raise ValueError(f"sync_copy: the source and destination pytrees differ: {src_tree} "
                         f"vs {dst_tree}")
    if not srcs:
        return
    for s, d in zip(srcs, dsts):
        _check_copy(s, d, "sync_copy")

    def body(sem):
        descs = [AsyncCopyDescriptor(s, d, sem, add=add) for s, d in zip(srcs, dsts)]
        for desc in descs:
            desc.start()
        for desc in descs:
            desc.wait()

    run_scoped(body, SemaphoreType.DMA)


def make_async_remote_copy(src_ref, dst_ref, send_sem, recv_sem, device_id,
                           device_id_type: DeviceIdType = DeviceIdType.MESH
                           ) -> AsyncCopyDescriptor:
    """A DMA from this device's ``src_ref`` to ``dst_ref`` on ``device_id``."""
    return AsyncCopyDescriptor(src_ref, dst_ref, recv_sem, send_sem, device_id,
                               device_id_type, unused=True)


def async_remote_copy(src_ref, dst_ref, send_sem, recv_sem, device_id,
                      device_id_type: DeviceIdType = DeviceIdType.MESH
                      ) -> AsyncCopyDescriptor:
    """Starts a remote DMA at once and returns its descriptor."""
    desc = make_async_remote_copy(src_ref, dst_ref, send_sem, recv_sem, device_id,
                                  device_id_type)
    desc.start()
    return desc


def _pp_dma_start(eqn, context, settings):
    """A local DMA prints as upstream's ``dma_start(p0[, add]) src[idx] -> dst[...] sem``;
    a remote one (a source semaphore or a device id) with all its params."""
    p = eqn.params
    src, dst, sem, src_sem = p["refs"]
    if src_sem is not None or p["device_id_tree"] is not None:
        return jc.pp_eqn_generic(eqn, context, settings)

    def ref(spec, bare=False):
        pos, n, tree = spec
        transforms = jax.tree_util.tree_unflatten(tree, eqn.invars[pos + 1:pos + 1 + n])
        if bare and not transforms:  # a whole semaphore prints as its name
            return jc.core.pp_var(eqn.invars[pos], context)
        return jc.pp_ref_transforms(context, eqn.invars[pos], tuple(transforms))

    head = f"dma_start(p{p['priority']}{', add' if p['add'] else ''}) "
    return jc.pp.concat([jc.pp.text(head), ref(src), jc.pp.text(" -> "), ref(dst),
                         jc.pp.text(" "), ref(sem, bare=True)])


jc.pp_eqn_rules[dma_start_p] = _pp_dma_start


# -- interpreter rules -----------------------------------------------------------------------


def dma_start_rule(ctx, eqn, invals):
    p = eqn.params
    check_copy_eqn(eqn)
    if p["device_id_tree"] is not None:
        return remote_dma_start(ctx, eqn, invals)
    (src, s_flat, s_tree), (dst, d_flat, d_tree), (sem, m_flat, m_tree), src_sem = (
        R.unflatten(p["refs"], invals))
    # Indexed DMAs (x_hbm.at[idx], idx an array, a ref or plsc.Indices): see dma_indexed.
    rs, rd = DI.resolve(src, s_flat, s_tree), DI.resolve(dst, d_flat, d_tree)
    DI.check_bounds(ctx, src, rs, "source")
    DI.check_bounds(ctx, dst, rd, "destination")
    (s_flat, s_tree), (d_flat, d_tree) = (rs.flat, rs.tree), (rd.flat, rd.tree)
    if RT.has_run_time_size(s_flat, s_tree) or RT.has_run_time_size(d_flat, d_tree):
        if p["add"]:
            raise NotImplementedError("a DMA with add=True of a view of run-time size")
        dst.value, size = RT.copy(src.value, s_flat, s_tree, dst.value, d_flat, d_tree)
        _count_bytes(sem, m_flat, m_tree, src_sem, size)
        return []
    data = read_cell(src, s_flat, s_tree)
    if rs.skip is not None:  # an ignored source index leaves its destination row as it was
        data = jnp.where(DI.skip_mask(rs, data.shape), read_cell(dst, d_flat, d_tree), data)
    if rd.skip is not None:  # an ignored destination index receives nothing
        data = (jnp.where(DI.skip_mask(rd, data.shape), jnp.zeros_like(data), data)
                if p["add"] else DI.first_kept(rd, data))
    old = dst.value
    if p["add"]:  # every contribution lands, also for repeated destination indices
        # An atomic accumulate on hardware: concurrent writers' adds all land (Cell.accumulate).
        dst.accumulate(lambda v: jc.add_view(v, data, d_flat, d_tree))
    else:
        write_cell(dst, d_flat, d_tree, data)
        if rd.skip is not None:  # every index ignored: nothing moved at all
            dst.value = jnp.where(jnp.all(rd.skip), old, dst.value)
    _count_bytes(sem, m_flat, m_tree, src_sem, R.nbytes(jax.typeof(data)))
    return []


def _count_bytes(sem, m_flat, m_tree, src_sem, size) -> None:
    """A started DMA adds its bytes to its semaphore (and its source semaphore)."""
    write_cell(sem, m_flat, m_tree, read_cell(sem, m_flat, m_tree) + jnp.int32(size))
    if src_sem is not None:
        c, f, t = src_sem
        write_cell(c, f, t, read_cell(c, f, t) + jnp.int32(size))


def dma_wait_rule(ctx, eqn, invals):
    p = eqn.params
    (sem, m_flat, m_tree), _src, (dst, d_flat, d_tree) = R.unflatten(p["refs"], invals)
    rd = DI.resolve(dst, d_flat, d_tree)
    if RT.has_run_time_size(rd.flat, rd.tree):
        size, said = RT.view_nbytes(dst.value, rd.flat, rd.tree), "a size known at run time"
    else:
        size = R.nbytes(jax.typeof(read_cell(dst, rd.flat, rd.tree)))
        said = f"{size} bytes"
    cur = read_cell(sem, m_flat, m_tree)
    ctx.report(
        jnp.all(cur >= size),
        f"DMA wait on {sem.origin} would block forever: no DMA of this size "
        f"({said}) was started on that semaphore",
    )
    write_cell(sem, m_flat, m_tree, cur - jnp.int32(size))
    return []


INTERPRET_RULES = {dma_start_p: dma_start_rule, dma_wait_p: dma_wait_rule}
