"""Running one device's part of a ``pallas_call`` (or ``core_map``) in the simulation.

Per device: the operands become HBM buffers (inputs padded to whole blocks, outputs
uninitialised or aliased to their input), then every core runs its share of the grid.
``parallel`` grid axes (a prefix of the grid) are visited in a seeded random order and
split across the cores; per grid point a core copies the input blocks that changed from
HBM into its VMEM block buffers, runs the kernel body, and copies each output block back
to HBM when the next point moves to another block (or at its last point).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import warnings
import weakref
from typing import Any

import numpy as np

from pallas.plugins import Blocked, BoundedSlice, Element, Squeezed, run_scoped_p
from pallas_tpu._src.interpret import boxes as B
from pallas_tpu._src.interpret import state as S
from pallas_tpu._src.interpret.evaluator import Core, rule
from pallas_tpu._src.interpret.fast import (
    compiled_body,
    compiled_index_maps,
    run_point,
    scalar_index_maps,
    usable,
)
from pallas_tpu._src.interpret.jax_calls import DeviceCalls
from pallas_tpu._src.interpret.state import Buffer, Simulation
from pallas_tpu._src.interpret.sync import SemaphoreRef
from pallas_tpu._src.memory import MemorySpace, SemaphoreType, canonical_space


@dataclasses.dataclass(frozen=True, eq=False)
class Config:
    """What a device's callback needs besides its operands (static per kernel)."""

    kind: str  # "pallas_call" or "core_map"
    name: str
    jaxpr: Any  # ClosedJaxpr of the kernel body
    params: Any  # InterpretParams
    num_devices: int
    mesh_axes: tuple  # ((name, size), ...) of the devices' mesh
    num_cores: int
    grid_mapping: Any = None
    parallel: tuple = ()  # per grid dim: is it parallel
    permutations: tuple = ()  # per grid dim: the visiting order (parallel dims) or None
    core_axis: str | None = None  # core_map: the mesh axis naming the core
    operand_spaces: tuple = ()  # core_map: memory space per operand (HBM, or SMEM/VMEM)
    value_operands: frozenset = frozenset()  # core_map: operands that are values, not refs
    operand_names: tuple = ()


def is_hbm(space) -> bool:
    return space is not None and canonical_space(space) in (MemorySpace.ANY, MemorySpace.HBM)


def _space(space):
    c = canonical_space(space)
    return MemorySpace.VMEM if c is None else c


def _is_sem(space) -> bool:
    return isinstance(canonical_space(space), SemaphoreType) or (
        canonical_space(space) is MemorySpace.SEMAPHORE)


def new_buffer(sim: Simulation, key, shape, dtype, space, name: str, fill=None) -> Buffer:
    """A buffer for ``shape``; VMEM is padded to the chip's tiling with
    ``buffer_bounds="padded"``; ``fill`` (an array) initialises the logical part."""
    p = sim.params
    pad = p.buffer_bounds == "padded" and canonical_space(space) in (None, MemorySpace.VMEM)
    storage_shape = B.padded_shape(shape, dtype) if pad else tuple(shape)
    storage = B.uninitialized_array(storage_shape, dtype, p.uninitialized_memory)
    buf = Buffer(storage, shape, name, _space(space), key, p.uninitialized_memory)
    if fill is not None:
        buf.value = fill
    return buf


def semaphore_ref(sim: Simulation, key, shape, space, name: str, device: int):
    sem = sim.semaphore(key, shape, name)
    return SemaphoreRef(sem, key, device, canonical_space(space), name)


# -- the device entry point ---------------------------------------------------------------


def run_device(cfg: Config, device: int, axis_coords, *args) -> list[np.ndarray]:
    """One device's callback: joins the call's simulation, runs its cores, returns its
    outputs (``pallas_call``) or the final contents of its operands (``core_map``)."""
    device = int(device)
    sim = S.join(id(cfg), device, lambda: _make_sim(cfg))
    axis_env = {n: int(c) for (n, _), c in zip(cfg.mesh_axes, np.asarray(axis_coords))}
    me = f"device {device}"
    try:
        if cfg.kind == "pallas_call":
            cfg, args = runtime_config(cfg, args)
            setup = _setup_pallas_call(sim, cfg, device, args)
        else:
            setup = _setup_core_map(sim, cfg, device, args)
        sim.barrier(me, "start", sim.num_devices, _sync_all_clocks(sim))
        _run_cores(sim, cfg, device, axis_env, setup)
        sim.barrier(me, "end", sim.num_devices, _sync_all_clocks(sim))
        _warn_pending(sim, device)
        return [np.array(b.value) for b in setup["results"]]
    except BaseException as e:
        sim.fail(e, me)
        raise
    finally:
        S.GROUPS.leave(sim)


def runtime_config(cfg: Config, args) -> tuple[Config, tuple]:
    """For a dynamic grid, whose sizes are the first operands: the config with the grid
    made concrete, and the remaining operands. (Dynamic sizes are only allowed on
    non-parallel dimensions, so the visiting orders were drawn at trace time.) A static
    grid's config is returned as it is."""
    gm = cfg.grid_mapping
    nb = gm.num_dynamic_grid_bounds
    if not nb:
        return cfg, args
    grid = gm.runtime_grid([int(np.asarray(b)) for b in args[:nb]])
    gm = dataclasses.replace(gm, grid=grid)
    return dataclasses.replace(cfg, grid_mapping=gm), args[nb:]


def _make_sim(cfg: Config) -> Simulation:
    sim = Simulation(cfg.params, cfg.num_devices, cfg.num_cores, cfg.name)
    sim.mesh_axes = cfg.mesh_axes
    return sim


def _sync_all_clocks(sim: Simulation):
    if not sim.detect:
        return None
    return lambda: sim.clocks.barrier(range(sim.total_cores))


def _warn_pending(sim: Simulation, device: int) -> None:
    with sim.cond:
        for key, sem in sim.semaphores.items():
            if key[-1] != device:
                continue
            if np.any(sem.counts != 0) or any(sem.tasks.values()):
                left = sum(len(q) for q in sem.tasks.values())
                warnings.warn(
                    f"TPU interpret mode: at the end of {sim.name}, semaphore {sem.name} on "
                    f"device {device} has a non-zero count ({sem.counts.tolist()})"
                    + (f" and {left} DMA(s) started but never waited for" if left else ""),
                    RuntimeWarning, stacklevel=2)


def _run_cores(sim: Simulation, cfg: Config, device: int, axis_env, setup) -> None:
    calls = DeviceCalls() if sim.num_cores > 1 else None

    def run(c):
        core = Core(sim, device, c, axis_env)
        if calls is not None:
            core.jax_call = calls
        if cfg.core_axis is not None:
            core.axis_env[cfg.core_axis] = c
        try:
            if cfg.kind == "pallas_call":
                _run_grid(core, cfg, setup)
            else:
                core.eval_closed(cfg.jaxpr, [*setup["operands"], *_core_map_scratch(
                    core, cfg)])
        finally:
            sim.thread_done()

    if sim.num_cores == 1:
        run(0)
        return
    errors: list = [None] * sim.num_cores

    def target(c):
        try:
            run(c)
        except BaseException as e:  # noqa: BLE001 - re-raised on the device's thread
            errors[c] = e
            sim.fail(e, f"core {c} of device {device}")

    threads = [threading.Thread(target=target, args=(c,), daemon=True)
               for c in range(sim.num_cores)]
    for t in threads:
        t.start()
    calls.serve(threads)
    for t in threads:
        t.join()
    real = [e for e in errors if e is not None and not isinstance(e, S.SimulationAborted)]
    if real:
        raise real[0]
    if any(e is not None for e in errors):
        raise next(e for e in errors if e is not None)


# -- pallas_call ------------------------------------------------------------------------------


def _pads(bm):
    pads = []
    for d, n in zip(bm.block_dims, bm.array_aval.shape):
        if isinstance(d, Blocked):
            pads.append((0, -(-n // d.block_size) * d.block_size - n))
        elif isinstance(d, Element):
            pads.append(tuple(d.padding))
        elif isinstance(d, BoundedSlice):
            pads.append((0, 0))
        else:
            pads.append((0, 0))
    return pads


def _hbm_buffer(sim, key, value, pads, name, uninit, aval=None):
    """An HBM buffer holding ``value`` (or, with ``value=None``, uninitialised memory of
    ``aval``'s shape) inside ``pads``."""
    if value is not None:
        value = np.asarray(value)
    logical_shape = value.shape if value is not None else tuple(aval.shape)
    dtype = value.dtype if value is not None else np.dtype(aval.dtype)
    shape = tuple(lo + n + hi for (lo, hi), n in zip(pads, logical_shape))
    logical = tuple(slice(lo, lo + n) for (lo, _), n in zip(pads, logical_shape))
    borrowed = value is not None and shape == logical_shape
    if borrowed:  # no padding: the input itself, read-only until a write copies it
        storage = value.view()
        storage.flags.writeable = False
    else:
        storage = B.uninitialized_array(shape, dtype, uninit)
        if value is not None:
            storage[logical] = value
    buf = Buffer(storage, shape, name, MemorySpace.HBM, key, uninit)
    buf.borrowed = borrowed
    buf.logical = logical
    return buf


class _Result:
    """An output as the callback returns it: the logical part of a padded HBM buffer."""

    def __init__(self, buf):
        self.buf = buf

    @property
    def value(self):
        return self.buf.storage[self.buf.logical]


def _setup_pallas_call(sim: Simulation, cfg: Config, device: int, args) -> dict:
    gm = cfg.grid_mapping
    p = cfg.params
    nsp = gm.num_scalar_prefetch
    prefetch, inputs = args[:nsp], args[nsp:]
    pre = [sim.buffer(("prefetch", i, device, None), lambda a=a, i=i: new_buffer(
        sim, ("prefetch", i, device, None), np.shape(a), np.asarray(a).dtype,
        MemorySpace.SMEM, f"scalar prefetch {i}", fill=np.asarray(a)))
        for i, a in enumerate(prefetch)]
    in_bufs = []
    for i, (x, bm) in enumerate(zip(inputs, gm.in_block_mappings)):
        key = ("input", i, device, None)
        in_bufs.append(sim.buffer(key, lambda x=x, bm=bm, key=key: _hbm_buffer(
            sim, key, x, _pads(bm), bm.origin, p.uninitialized_memory)))
    aliases = {o: i - nsp for i, o in gm.input_output_aliases}
    out_bufs = []
    for o, bm in enumerate(gm.out_block_mappings):
        if o in aliases:
            out_bufs.append(in_bufs[aliases[o]])
            continue
        key = ("output", o, device, None)
        out_bufs.append(sim.buffer(key, lambda bm=bm, key=key: _hbm_buffer(
            sim, key, None, _pads(bm), bm.origin, p.uninitialized_memory,
            bm.array_aval)))
    return {"prefetch": pre, "inputs": in_bufs, "outputs": out_bufs,
            "results": [_Result(b) for b in out_bufs], "aliases": aliases}


def _scratch(core: Core, cfg: Config) -> list:
    gm = cfg.grid_mapping
    out = []
    for i, (t, origin) in enumerate(zip(gm.scratch_types, gm.scratch_origins)):
        out.append(_allocate(core, ("scratch", i), t, origin))
    return out


def _allocate(core: Core, ident, t, origin: str):
    """A buffer for a scratch/run_scoped type: semaphores and HBM shared by the device's
    cores, VMEM/SMEM private to the core."""
    sim, device = core.sim, core.device
    if _is_sem(t.memory_space):
        return semaphore_ref(sim, (*ident, device), t.shape, t.memory_space, origin, device)
    if is_hbm(t.memory_space):
        key = (*ident[:2], device, None, *ident[2:])
        return sim.buffer(key, lambda: new_buffer(sim, key, t.shape, t.dtype,
                                                  t.memory_space, origin))
    key = (*ident[:2], device, core.core, *ident[2:])
    return sim.buffer(key, lambda: new_buffer(sim, key, t.shape, t.dtype, t.memory_space,
                                              origin))


def _block_box(bm, pads, indices):
    """The HBM box of the block at ``indices`` (index-map outputs), and the sizes of
    BoundedSlice dims."""
    box, it = [], iter(indices)
    for d, (lo, _) in zip(bm.block_dims, pads):
        i = int(next(it))
        if isinstance(d, Blocked):
            box.append(B.Dim(i * d.block_size + lo, d.block_size))
        elif isinstance(d, Element):
            box.append(B.Dim(i, d.block_size))
        elif isinstance(d, BoundedSlice):
            size = int(next(it))
            box.append(B.Dim(i + lo, size))
        elif isinstance(d, Squeezed):
            box.append(B.Dim(i + lo, 1, squeezed=True))
        else:
            raise NotImplementedError(f"TPU interpret mode: block dimension {d}")
    return tuple(box)


def _grid_order(cfg: Config, core: int):
    """This core's grid points, in order (upstream's split of parallel axes)."""
    gm = cfg.grid_mapping
    grid = tuple(gm.grid)
    n = math.prod(grid)
    par = cfg.parallel
    sub = math.prod(g for g, q in zip(grid, par) if q) if grid else 1
    per_core = -(-sub // cfg.num_cores) * (n // sub if sub else 0)
    start, stop = core * per_core, min((core + 1) * per_core, n)
    perms = cfg.permutations
    dims = [int(g) for g in reversed(grid)]
    for t in range(start, stop):
        loop, rest = [], t
        for g in dims:  # row-major unravel of t
            rest, i = divmod(rest, g)
            loop.append(i)
        loop.reverse()
        point = tuple(int(perms[d][i]) if par[d] else i for d, i in enumerate(loop))
        yield tuple(loop), point


_orders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _points(cfg: Config, core: int) -> list:
    """``_grid_order`` with each point's indices as ``np.int32`` too (what
    ``pl.program_id`` returns), computed once per kernel configuration and core."""
    per_core = _orders.get(cfg)
    if per_core is None:
        per_core = _orders[cfg] = {}
    hit = per_core.get(core)
    if hit is None:
        hit = per_core[core] = [(loop, point, tuple(np.int32(i) for i in point))
                                for loop, point in _grid_order(cfg, core)]
    return hit


def _run_grid(core: Core, cfg: Config, setup) -> None:
    gm = cfg.grid_mapping
    p = cfg.params
    sim = core.sim
    names = gm.grid_names or ()
    scratch = _scratch(core, cfg)
    n_in = gm.num_inputs
    kernel_in, kernel_out = [], []
    for k, bm in enumerate(gm.block_mappings):
        hbm = setup["inputs"][k] if k < n_in else setup["outputs"][k - n_in]
        if is_hbm(bm.memory_space):
            kernel_in.append(hbm) if k < n_in else kernel_out.append(hbm)
            continue
        key = ("block", k, core.device, core.core)
        buf = sim.buffer(key, lambda bm=bm, key=key: new_buffer(
            sim, key, bm.ref_shape, bm.array_aval.dtype, bm.memory_space, bm.origin))
        (kernel_in if k < n_in else kernel_out).append(buf)
    args = [*setup["prefetch"], *kernel_in, *kernel_out, *scratch]
    points = _points(cfg, core.core)
    in_bms, out_bms = list(gm.in_block_mappings), list(gm.out_block_mappings)
    step = compiled_body(cfg.jaxpr, gm.grid, tuple(names) or None, p)
    if step is not None and not usable(args, sim.num_cores):
        step = None
    core.local_only = step is not None
    history: dict = {}
    prev = None
    boxes_at = _box_finder(core, cfg, setup)
    boxes = boxes_at(points[0][1]) if points else None
    in_blocks = [(k, bm) for k, bm in enumerate(in_bms) if not is_hbm(bm.memory_space)]
    out_blocks = [(o, bm) for o, bm in enumerate(out_bms) if not is_hbm(bm.memory_space)]
    grid = tuple(gm.grid)
    axis_names = tuple(names) if names else None
    for t, (loop, point, indices) in enumerate(points):
        core.set_grid_indices(indices, grid, axis_names)
        if p.grid_point_recorder is not None:
            p.grid_point_recorder(np.int32(0), tuple(np.int32(i) for i in point),
                                  np.int32(core.core))
        nxt = boxes_at(points[t + 1][1]) if t + 1 < len(points) else None
        for k, bm in in_blocks:
            if prev is None or boxes[k] != prev[k]:
                _copy_in(core, setup["inputs"][k], boxes[k], kernel_in[k], bm, loop, point)
        if step is not None:
            core.jax_call(run_point, step, point, args)
        else:
            core.eval_closed(cfg.jaxpr, args)
        for o, bm in out_blocks:
            k = n_in + o
            if nxt is None or nxt[k] != boxes[k]:
                _copy_out(core, kernel_out[o], setup["outputs"][o], boxes[k], bm, loop, point)
            if o not in setup["aliases"]:
                _check_revisit(history, o, boxes[k], loop)
        prev, boxes = boxes, nxt


_statics: dict = {}  # keyed by the object itself (by identity), never by its id()


def _static(gm):
    """Per grid mapping: which block mappings are HBM operands, and their paddings."""
    hit = _statics.get(gm)
    if hit is None:
        skip = tuple(is_hbm(bm.memory_space) for bm in gm.block_mappings)
        hit = _statics[gm] = (skip, [_pads(bm) for bm in gm.block_mappings])
    return hit


_memos: dict = {}  # keyed by the object itself (by identity), never by its id()


def _box_memo(gm) -> list:
    """Per block mapping of ``gm``: block index -> its HBM box (a pure function of the
    index; kept per grid mapping, cleared past 65536 entries per operand)."""
    hit = _memos.get(gm)
    if hit is None:
        if len(_memos) > 256:  # e.g. a dynamic grid's mapping is new at every call
            _memos.clear()
        hit = _memos[gm] = [{} for _ in gm.block_mappings]
    return hit


def _box_finder(core: Core, cfg: Config, setup):
    """``boxes_at(point)``: the HBM box of every block operand at ``point`` (None for HBM
    operands). Boxes are memoised per block index (see :func:`_box_memo`)."""
    gm = cfg.grid_mapping
    skip, pads = _static(gm)
    fast = scalar_index_maps(gm, skip)
    maps = compiled_index_maps(gm, skip) if fast is None else None
    bms = list(gm.block_mappings)
    memo = _box_memo(gm)

    def boxes_at(point):
        if fast is not None:
            idxs = fast(point)
        else:
            idxs = core.jax_call(maps, np.asarray(point, np.int32),
                                 *[b.value for b in setup["prefetch"]])
        out = []
        for bm, s, p, i, m in zip(bms, skip, pads, idxs, memo):
            if s:
                out.append(None)
                continue
            key = tuple(i) if type(i) in (list, tuple) else tuple(np.asarray(i).tolist())
            box = m.get(key)
            if box is None:
                if len(m) > 65536:
                    m.clear()
                box = m[key] = _block_box(bm, p, key)
            out.append(box)
        return out

    return boxes_at


def _copy_in(core, hbm: Buffer, box, buf: Buffer, bm, loop, point) -> None:
    site = f"the pallas_call's copy of {bm.origin} into VMEM"
    if B.out_of_bounds(box, hbm.storage.shape) and core.params.out_of_bounds_reads == "raise":
        raise IndexError(
            f"Out-of-bounds block index {_block_index(bm, box)} for input \"{bm.origin}\" in "
            f"iteration {loop} on device {core.device} (core {core.core}): reading "
            f"{B.describe(box)} but input has shape {hbm.storage.shape}."
        )
    data = core.read(hbm, box, site, copy=False)  # store() copies it into the buffer
    _store()(core, buf, B.full_box(buf.shape), data.reshape(buf.shape), site)


def _copy_out(core, buf: Buffer, hbm: Buffer, box, bm, loop, point) -> None:
    site = f"the pallas_call's copy of {bm.origin} out of VMEM"
    if B.out_of_bounds(box, hbm.storage.shape):
        raise IndexError(
            f"Out-of-bounds block index {_block_index(bm, box)} for output \"{bm.origin}\" "
            f"in iteration {loop} on device {core.device} (core {core.core}): writing "
            f"{B.describe(box)} but output has shape {hbm.storage.shape}."
        )
    data = core.read(buf, B.full_box(buf.shape), site, copy=False)
    _store()(core, hbm, box, data.reshape(B.box_shape(box)) if data.size == math.prod(
        B.box_shape(box)) else data[tuple(slice(0, d.count) for d in box
                                          if not d.squeezed)], site)


def _write(core, buf, box, value, site: str) -> None:
    core.write(buf, box, value, site)


# The function the block copies write through: ``pallas_tpu.interpret`` (above this
# module) installs one that calls its ``store`` attribute at each copy, so that a test
# may wrap ``pallas_tpu.interpret.store``; until it is imported, the plain write.
_STORE: list = [_write]


def store_through(fn) -> None:
    """Makes the simulation's block copies write through ``fn(core, buf, box, value,
    site)`` (called by ``pallas_tpu.interpret``)."""
    _STORE[0] = fn


def _store():
    return _STORE[0]


def _block_index(bm, box):
    out = []
    for d, b in zip(bm.block_dims, box):
        out.append(b.start // d.block_size if isinstance(d, Blocked) else b.start)
    return tuple(out)


def _check_revisit(history: dict, o: int, box, loop) -> None:
    """Raises when output ``o`` comes back to ``box`` after leaving it (its earlier
    contents would be lost). ``history[o]``: the current box, and per box visited the
    first and last iteration of its visit."""
    seen = history.get(o)
    if seen is None:
        seen = history[o] = [None, {}]
    visits = seen[1]
    if seen[0] == box:
        visits[box][1] = loop
        return
    earlier = visits.get(box)
    if earlier is not None:
        raise RuntimeError(
            f"Revisited block {B.describe(box)} of output {o} in iteration {loop}. The "
            f"block was previously visited in iterations {earlier[0]} through {earlier[1]} ."
        )
    seen[0] = box
    visits[box] = [loop, loop]


# -- core_map -----------------------------------------------------------------------------------


def _setup_core_map(sim: Simulation, cfg: Config, device: int, args) -> dict:
    bufs = []
    for i, (x, name) in enumerate(zip(args, cfg.operand_names)):
        key = ("operand", i, device, None)
        space = cfg.operand_spaces[i] if cfg.operand_spaces else MemorySpace.HBM
        bufs.append(sim.buffer(key, lambda x=x, key=key, name=name, space=space: Buffer(
            np.array(x), np.shape(x), name, space, key, cfg.params.uninitialized_memory)))
    # A value the body closes over (say a grid size computed inside jit) is read as the
    # value it is; its buffer only gives the discharge its (unchanged) result.
    operands = [np.asarray(x) if i in cfg.value_operands else b
                for i, (x, b) in enumerate(zip(args, bufs))]
    return {"operands": operands, "results": bufs}


def _core_map_scratch(core: Core, cfg: Config) -> list:
    types = cfg.grid_mapping or ()
    return [_allocate(core, ("core_map scratch", i), t, f"core_map scratch {i}")
            for i, t in enumerate(types)]


# -- run_scoped -------------------------------------------------------------------------------


@rule(run_scoped_p)
def _run_scoped_rule(core: Core, eqn, invals):
    """Allocates the scope's buffers: the n-th entry of a core into this scope gets the
    same semaphores and HBM buffers as the n-th entry of the device's other cores (and
    of other devices, for remote DMAs); VMEM/SMEM are the core's own."""
    n = core.scope_entries.get(id(eqn), 0)
    core.scope_entries[id(eqn)] = n + 1
    new = [_allocate(core, ("scoped", id(eqn), i, n), t, f"run_scoped buffer {i}")
           for i, t in enumerate(eqn.params["types"])]
    return core.eval(eqn.params["jaxpr"], (), [*invals, *new])
