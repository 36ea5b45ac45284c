"""DMAs, semaphores and barriers of the simulated TPU (rules of the simulation).

A DMA is a small state machine: it *reads* its source and signals the send semaphore
(remote copies), then *writes* its destination and signals the receive semaphore. When
that happens is ``InterpretParams.dma_execution_mode``: at ``start()`` ("eager"); when a
core waits on the semaphore the DMA will signal ("on_wait"); or at a random later
scheduling point of the issuing core, and at the latest at that wait ("random").

For race detection a DMA is its own thread: its clock is its issuer's at ``start()``
plus a stamp on one of the "virtual" entries of the vector clocks (chosen at random,
as upstream does); a semaphore carries the clocks of its signals to its waiters.
"""

from __future__ import annotations

import math

import numpy as np

from pallas import DeviceIdType
from pallas.plugins import semaphore_read_p, semaphore_signal_p, semaphore_wait_p
from pallas_tpu._src.interpret import boxes as B
from pallas_tpu._src.interpret import indexed as IX
from pallas_tpu._src.interpret.evaluator import Core, rule, site_of, view
from pallas_tpu._src.interpret.state import Buffer, Semaphore
from pallas_tpu._src.memory import SemaphoreType
from pallas_tpu._src.primitives import dma as dma_prims
from pallas_tpu._src.primitives import misc
from pallas_tpu._src.primitives import refs as R


class SemaphoreRef(Buffer):
    """A semaphore operand of a kernel: the device's :class:`Semaphore` named ``key``."""

    def __init__(self, sem: Semaphore, key, device: int, memory_space, name: str):
        super().__init__(np.zeros(sem.shape, np.int32), sem.shape, name, memory_space, key)
        self.sem = sem
        self.device = device


_flats: dict = {}


def sem_index(ref: SemaphoreRef, flat, tree) -> int:
    """The flat index of the single semaphore of ``ref`` that the view names (cached
    per view and semaphore shape once checked)."""
    box, _ = view(ref, flat, tree)
    key = (box, ref.sem.shape)
    hit = _flats.get(key)
    if hit is not None:
        return hit
    if box is None or not all(d.squeezed for d in box):
        raise ValueError(f"a semaphore operation needs a single semaphore of {ref.origin}; "
                         f"got a view of shape {B.box_shape(box) if box else '?'}")
    out = ref.sem.flat([d.start for d in box])  # raises when out of bounds
    if len(_flats) > 4096:
        _flats.clear()
    _flats[key] = out
    return out


def remote_sem(core: Core, ref: SemaphoreRef, device: int) -> Semaphore:
    if device == ref.device:
        return ref.sem
    key = (*ref.key[:-1], device)
    return core.sim.semaphore(key, ref.sem.shape, ref.origin)


# -- device ids -----------------------------------------------------------------------------


def target_device(core: Core, leaves, tree, id_type) -> int:
    if tree is None or tree.num_leaves == 0:
        return core.device
    import jax

    device_id = jax.tree_util.tree_unflatten(tree, [int(np.asarray(x)) for x in leaves])
    axes = core.sim.mesh_axes
    if id_type == DeviceIdType.LOGICAL:
        d = device_id[0] if isinstance(device_id, (tuple, list)) else device_id
        out = int(d)
    else:
        names = [n for n, _ in axes]
        if isinstance(device_id, dict):
            coords = [device_id.get(n, core.axis_env.get(n, 0)) for n in names]
        elif isinstance(device_id, (tuple, list)):
            coords = list(device_id)
        else:
            coords = [device_id]
        if len(coords) != len(axes):
            raise ValueError(f"device_id {device_id!r} has {len(coords)} coordinates but "
                             f"the mesh has axes {tuple(names)}")
        out = 0
        for c, (_, n) in zip(coords, axes):
            out = out * n + int(c)
    if not 0 <= out < core.sim.num_devices:
        raise ValueError(f"device_id {device_id!r} names device {out}, outside the "
                         f"{core.sim.num_devices} devices of the kernel's mesh")
    return out


# -- semaphores -------------------------------------------------------------------------------


def signal(core: Core, sem: Semaphore, target_core: int, flat: int, inc: int,
           clock=None) -> None:
    """Adds ``inc`` to ``sem``'s count for ``target_core``; ``clock`` is what it carries."""
    sim = core.sim
    with sim.lock:
        sem.flat_counts[target_core, flat] += inc
        if sim.logging:
            sim.log("SEMAPHORE", lambda: f"{core.who} signals {sem.name}[{flat}] of core "
                    f"{target_core} by {inc}")
        if sim.detect:
            if clock is None:
                clock = sim.clocks.release(core.gid)
            key = (target_core, flat)
            prev = sem.clocks.get(key)
            sem.clocks[key] = clock.copy() if prev is None else np.maximum(prev, clock)
        sim.notify_all()


def wait(core: Core, sem: Semaphore, flat: int, value: int, decrement: bool = True,
         what=None) -> None:
    """Blocks ``core`` until its count of ``sem`` reaches ``value`` (running the DMAs
    queued on it meanwhile), then takes ``value`` and the signals' clocks. ``what``
    names the wait in a deadlock error: a string, or a function making it (called only
    then)."""
    sim = core.sim
    counts = sem.flat_counts
    c = core.core
    tasks = sem.tasks[(c, flat)]
    with sim.lock:  # ``cond``'s lock: block_until waits on ``cond``
        while counts[c, flat] < value:
            if tasks:
                dma = _pick(sim, tasks)
                dma.run()
                continue
            name = what() if callable(what) else what
            sim.block_until(core.who, lambda: counts[c, flat] >= value or bool(tasks),
                            f"{name or sem.name} to reach {value}")
        if sim.logging:
            sim.log("SEMAPHORE", lambda: f"{core.who} waited for {sem.name}[{flat}] to "
                    f"reach {value}")
        if decrement:
            counts[core.core, flat] -= value
        if sim.detect:
            sim.clocks.acquire(core.gid, sem.clocks.get((core.core, flat)))


def _pick(sim, tasks):
    if sim.params.dma_execution_mode == "random" and len(tasks) > 1:
        k = sim.rng.randrange(len(tasks))
        tasks.rotate(-k)
    return tasks.popleft()


def _semaphore_operands(eqn, invals):
    """A semaphore signal's or wait's operands: (the ref, its view's index operands, the
    count, the operands after the count)."""
    ref, *rest = invals
    n = eqn.params["tree"].num_leaves
    return ref, rest[:n], int(np.asarray(rest[n])), rest[n + 1:]


@rule(semaphore_signal_p)
def _signal_rule(core: Core, eqn, invals):
    p = eqn.params
    ref, flat, inc, rest = _semaphore_operands(eqn, invals)
    ndev = p["device_id_tree"].num_leaves
    devs = rest[:ndev]
    target_core = int(np.asarray(rest[ndev])) if p["has_core"] else core.core
    device = target_device(core, devs, p["device_id_tree"], p["device_id_type"])
    if not 0 <= target_core < core.sim.num_cores:
        raise ValueError(f"semaphore_signal(core_index={target_core}): the kernel runs on "
                         f"{core.sim.num_cores} core(s) per device")
    sem = remote_sem(core, ref, device)
    run_random_dmas(core)
    signal(core, sem, target_core, sem_index(ref, flat, p["tree"]), inc)
    return []


@rule(semaphore_wait_p)
def _wait_rule(core: Core, eqn, invals):
    ref, flat, value, _ = _semaphore_operands(eqn, invals)
    run_random_dmas(core)
    wait(core, ref.sem, sem_index(ref, flat, eqn.params["tree"]), value, eqn.params["decrement"],
         lambda: f"{ref.origin} (at {site_of(eqn)})")
    return []


@rule(semaphore_read_p)
def _read_rule(core: Core, eqn, invals):
    ref, *flat = invals
    idx = sem_index(ref, flat, eqn.params["tree"])
    with core.sim.lock:
        return [np.int32(ref.sem.flat_counts[core.core, idx])]


@rule(misc.get_barrier_semaphore_p)
def _barrier_semaphore_rule(core: Core, eqn, invals):
    key = ("barrier", 0, core.device)
    sem = core.sim.semaphore(key, (), "the barrier semaphore")
    return [SemaphoreRef(sem, key, core.device, SemaphoreType.BARRIER,
                         "the barrier semaphore")]


@rule(misc.core_barrier_p)
def _core_barrier_rule(core: Core, eqn, invals):
    ref, *flat = invals
    n = eqn.params["num_cores"]
    idx = sem_index(ref, flat, eqn.params["tree"])
    for c in range(n):
        if c != core.core:
            signal(core, ref.sem, c, idx, 1)
    core.sim.log("BARRIER", lambda: f"{core.who} arrives at core_barrier {ref.origin}")
    wait(core, ref.sem, idx, n - 1, True, f"core_barrier on {ref.origin}")
    return []


# -- DMAs ---------------------------------------------------------------------------------------


class Dma:
    """One DMA in flight (see the module docstring)."""

    def __init__(self, core: Core, src: Buffer, src_box, dst: Buffer, dst_box,
                 dst_sem: Semaphore, dst_core: int, dst_flat: int,
                 src_sem: Semaphore | None, src_flat: int, add: bool, site: str):
        sim = core.sim
        self.sim, self.issuer, self.site, self.add = sim, core, site, add
        self.src, self.src_box, self.dst, self.dst_box = src, src_box, dst, dst_box
        self.dst_sem, self.dst_core, self.dst_flat = dst_sem, dst_core, dst_flat
        self.src_sem, self.src_flat = src_sem, src_flat
        self.nbytes = _nbytes(src_box, src.dtype)
        self.data = None
        self.state = "started"
        sim.dma_count += 1
        self.id = sim.dma_count
        if sim.detect:
            self.thread = sim.dma_thread()
            self.clock = sim.clocks.tick(core.gid)
            self.clock[self.thread] = sim.clocks.tick(self.thread)[self.thread]

    @property
    def who(self) -> str:
        return f"DMA #{self.id} issued by {self.issuer.who}"

    def _record(self, kind, buf, box):
        if self.sim.detect:
            self.sim.record(self.thread, self.clock, kind, buf, box, self.site, self.who)

    def read(self) -> None:
        """Reads the source (once) and signals the send semaphore."""
        if self.state != "started":
            return
        self.data = self._read_source()
        self.state = "read"
        if self.src_sem is not None:
            signal(self.issuer, self.src_sem, self.issuer.core, self.src_flat, self.nbytes,
                   self.clock if self.sim.detect else None)

    def run(self) -> None:
        """Reads (if not yet) and writes; signals the semaphores."""
        if self.state == "done":
            return
        if self.state == "started" and self._copy_direct():
            return
        self.read()
        self._next_event()
        self._write_destination()
        self._finish()

    def _read_source(self):
        return self._read(self.src_box)

    def _write_destination(self) -> None:
        self._write(self.dst_box, self.data)

    def _read(self, box) -> np.ndarray:
        self._record("read", self.src, box)
        return self.issuer.read(self.src, box, self.site, "read", record=False)

    def _write(self, box, data) -> None:
        self._record("write", self.dst, box)
        if self.add:
            data = self.issuer.read(self.dst, box, self.site, record=False) + data
        self.issuer.write(self.dst, box, data, self.site, record=False)

    def _next_event(self) -> None:
        """The write is a later event of the DMA than its read: the send semaphore
        (signalled after the read) must not order the write for its waiter."""
        if self.sim.detect:
            self.clock = self.clock.copy()
            self.clock[self.thread] = self.sim.clocks.tick(self.thread)[self.thread]

    def _copy_direct(self) -> bool:
        """:meth:`run` from start to end for a plain copy whose boxes are in bounds and
        of one shape (no send semaphore, no add, unpadded destination): the source box
        goes into the destination without an intermediate array. False otherwise."""
        src, dst, sb, db = self.src, self.dst, self.src_box, self.dst_box
        if self.src_sem is not None or self.add or dst.storage.shape != dst.shape:
            return False
        src_index = B.index_in(sb, src.storage.shape)
        dst_index = B.index_in(db, dst.shape)
        if src_index is None or dst_index is None or B.box_shape(sb) != B.box_shape(db):
            return False
        sim = self.sim
        self._record("read", src, sb)
        self._next_event()
        self._record("write", dst, db)
        with sim.lock:
            (dst.own() if dst.borrowed else dst.storage)[dst_index] = src.storage[src_index]
        self._finish()
        return True

    def _finish(self) -> None:
        sim = self.sim
        if sim.logging:
            sim.log("SHARED_MEMORY", lambda: f"{self.who} copied {self.src.origin}"
                    f"{_describe(self.src_box)} to {self.dst.origin}"
                    f"{_describe(self.dst_box)} ({self.nbytes} bytes)")
        self.data = None
        self.state = "done"
        _dequeue(self)  # it may still sit in the other semaphore's queue
        if sim.random_dmas:
            sim.pending_random.get(self.issuer.gid, set()).discard(self)
        signal(self.issuer, self.dst_sem, self.dst_core, self.dst_flat, self.nbytes,
               self.clock if sim.detect else None)


def run_random_dmas(core: Core) -> None:
    """In "random" mode: each DMA this core has in flight completes now with p = 1/2."""
    sim = core.sim
    if not sim.random_dmas:
        return
    pending = sim.pending_random.get(core.gid)
    if not pending:
        return
    with sim.lock:
        for dma in sorted(pending, key=lambda d: d.id):
            if sim.rng.random() < 0.5:
                _dequeue(dma)
                dma.run()


class IndexedDma(Dma):
    """A gather or scatter (boxes are RowViews): moves row by row, so repeated
    destination indices of a scatter-add all land; ignored rows move nothing."""

    def _copy_direct(self) -> bool:
        """Never: rows move one by one."""
        return False

    def _read_source(self) -> list:
        return [None if r is None else self._read(r) for r in self.src_box.rows]

    def _write_destination(self) -> None:
        for r, data in zip(self.dst_box.rows, self.data):
            if r is not None:
                self._write(r, data)


def _describe(box) -> str:
    return box.describe() if isinstance(box, IX.RowView) else B.describe(box)


def _dequeue(dma: Dma) -> None:
    q = dma.dst_sem.tasks.get((dma.dst_core, dma.dst_flat))
    if q and dma in q:
        q.remove(dma)
    if dma.src_sem is not None:
        q = dma.src_sem.tasks.get((dma.issuer.core, dma.src_flat))
        if q and dma in q:
            q.remove(dma)


def _box(buf, flat, tree, what):
    box, _ = view(buf, flat, tree)
    if box is None:
        raise NotImplementedError(
            f"TPU interpret mode: a DMA {what} must be a rectangular view of a buffer "
            f"(ref.at[...] with slices and indices); got {buf.origin} with other transforms"
        )
    return box


def _dma_views(core, src, sf, st, dst, df, dt, site):
    """The boxes a DMA moves between; for an indexed DMA (a gather or scatter) two
    :class:`~pallas_tpu._src.interpret.indexed.RowView` s of one row per index."""
    s_box, _ = view(src, sf, st)
    d_box, _ = view(dst, df, dt)
    if s_box is not None and d_box is not None:
        return s_box, d_box
    s_rows = None if s_box is not None else IX.rows_view(core, src, sf, st, site, "source")
    d_rows = None if d_box is not None else IX.rows_view(core, dst, df, dt, site,
                                                         "destination")
    if (s_box is None and s_rows is None) or (d_box is None and d_rows is None):
        _box(src, sf, st, "source")
        _box(dst, df, dt, "destination")
    if s_rows is None:
        s_rows = IX.split(s_box, d_rows.axis, d_rows)
    if d_rows is None:
        d_rows = IX.split(d_box, s_rows.axis, s_rows)
    if s_rows.shape != d_rows.shape or s_rows.axis != d_rows.axis:
        raise ValueError(f"TPU interpret mode: an indexed DMA from {src.origin} (moving "
                         f"{s_rows.shape}) to {dst.origin} (receiving {d_rows.shape}): "
                         f"the shapes and indexed axes must match")
    skip = [a is None or b is None for a, b in zip(s_rows.rows, d_rows.rows)]
    if any(skip):  # an entry either side ignores moves nothing
        s_rows, d_rows = (IX.RowView(tuple(None if k else r for k, r in zip(skip, v.rows)),
                                     v.axis, v.shape) for v in (s_rows, d_rows))
    return s_rows, d_rows


def remote_buffer(core: Core, buf: Buffer, device: int) -> Buffer:
    if device == core.device:
        return buf
    key = (*buf.key[:2], device, *buf.key[3:])
    remote = core.sim.buffers.get(key)
    if remote is None:
        raise ValueError(f"TPU interpret mode: remote DMA to {buf.origin} on device "
                         f"{device}, which has no such buffer (key {key})")
    return remote


_statics: dict = {}


def _static(eqn):
    """What a DMA equation's rule needs from its params, decoded once per equation:
    the operand count of its refs, each ref's (position, leaf count, tree), its site,
    and whether it names a device."""
    hit = _statics.get(eqn)  # keyed by the equation itself (by identity), never its id()
    if hit is not None:
        return hit
    p = eqn.params
    spec = p["refs"]
    tree = p["device_id_tree"]
    info = (R.spec_end(spec), tuple(spec), site_of(eqn),
            tree is not None and tree.num_leaves > 0)
    _statics[eqn] = info
    return info


def _operand(spec_entry, invals):
    pos, n, tree = spec_entry
    return invals[pos], invals[pos + 1:pos + 1 + n], tree


@rule(dma_prims.dma_start_p)
def _dma_start_rule(core: Core, eqn, invals):
    p = eqn.params
    dma_prims.check_copy_eqn(eqn)
    end, spec, site, remote = _static(eqn)
    src, sf, st = _operand(spec[0], invals)
    dst, df, dt = _operand(spec[1], invals)
    sem, mf, mt = _operand(spec[2], invals)
    src_sem = None if spec[3] is None else _operand(spec[3], invals)
    device = core.device if not remote else target_device(
        core, invals[end:], p["device_id_tree"], p["device_id_type"])
    src_box, dst_box = _dma_views(core, src, sf, st, dst, df, dt, site)
    dst_buf = remote_buffer(core, dst, device)
    dsem = remote_sem(core, sem, device)
    ssem, sflat = None, 0
    if src_sem is not None:
        ssem, sflat = src_sem[0].sem, sem_index(*src_sem)
    sim = core.sim
    if sim.random_dmas:
        run_random_dmas(core)
    with sim.lock:
        kind = IndexedDma if isinstance(src_box, IX.RowView) else Dma
        dma = kind(core, src, src_box, dst_buf, dst_box, dsem, core.core,
                   sem_index(sem, mf, mt), ssem, sflat, p["add"], site)
        mode = sim.params.dma_execution_mode
        if mode == "eager":
            dma.run()
            return []
        if ssem is not None:
            ssem.tasks[(core.core, sflat)].append(dma)
        dsem.tasks[(core.core, dma.dst_flat)].append(dma)
        if mode == "random":
            sim.pending_random.setdefault(core.gid, set()).add(dma)
        sim.notify_all()
    return []


_sizes: dict = {}


def _nbytes(box, dtype) -> int:
    """The bytes a DMA of ``box`` moves (cached per box shape and dtype)."""
    if isinstance(box, IX.RowView):
        return box.nbytes(dtype)
    key = (B.box_shape(box), dtype)
    hit = _sizes.get(key)
    if hit is None:
        if len(_sizes) > 4096:
            _sizes.clear()
        hit = _sizes[key] = math.prod(key[0]) * dtype.itemsize
    return hit


@rule(dma_prims.dma_wait_p)
def _dma_wait_rule(core: Core, eqn, invals):
    _, spec, site, _ = _static(eqn)
    sem, mf, mt = _operand(spec[0], invals)
    buf, flat, tree = _operand(spec[2 if eqn.params["kind"] == "recv" else 1], invals)
    box, _ = view(buf, flat, tree)
    if box is None:  # an indexed view (the wait of a gather or scatter)
        box = IX.rows_view(core, buf, flat, tree, site, "view", record=False)
    nbytes = _nbytes(box if box is not None else _box(buf, flat, tree, "view"), buf.dtype)
    if core.sim.random_dmas:
        run_random_dmas(core)
    wait(core, sem.sem, sem_index(sem, mf, mt), nbytes, True,
         lambda: f"DMA semaphore {sem.origin} (wait at {site})")
    return []
