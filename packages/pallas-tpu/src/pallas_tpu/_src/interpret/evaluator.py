"""One simulated TensorCore: evaluates a kernel jaxpr eagerly, on its own thread.

Refs are :class:`~pallas_tpu._src.interpret.state.Buffer` objects. Loads and stores
index their numpy storage in place (checking bounds, recording accesses for the race
detector); control flow whose body touches refs or synchronises runs in Python, so a
semaphore wait in a loop blocks only its core. Everything else (arithmetic, and loops
over plain values) is bound to JAX as is, so it runs compiled.
"""

from __future__ import annotations

import jax
import numpy as np

from pallas.plugins import (
    KernelContext,
    axis_index_p,
    interpret_rules,
    load_p,
    num_programs_p,
    program_id_p,
    swap_p,
    walk_jaxpr,
)
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.interpret import boxes as B
from pallas_tpu._src.interpret.plan import (  # noqa: F401 - rule, CF re-exported
    _CONTROL,
    CF,
    COND_RULE,
    GRID_RULE,
    RULES,
    Segment,
    _needs_engine,
    _sub_jaxprs,
    plan_of,
    program_of,
    rule,
)
from pallas_tpu._src.interpret.state import Buffer, Simulation
from pallas_tpu._src.memory import MemorySpace


class Core:
    """The state of one core of one device while it runs (part of) a kernel."""

    def __init__(self, sim: Simulation, device: int, core: int, axis_env: dict):
        self.sim = sim
        self.device = int(device)
        self.core = int(core)
        self.gid = sim.global_core(device, core)
        self.axis_env = dict(axis_env)  # mesh/core axis name -> index
        self.ctx = KernelContext((), (), axis_names=(), backend_state={})
        self.who = f"core {core} of device {device}"
        self.scope_entries: dict = {}
        self.params = sim.params
        # True while the kernel body is local (no DMAs): nothing but this core can then
        # touch its private buffers, so their accesses need no race bookkeeping.
        self.local_only = False
        # How JAX work is run: directly, or on the device's thread (several cores).
        self.jax_call = lambda fn, *args: fn(*args)

    # -- grid position ------------------------------------------------------------------
    def set_grid_indices(self, indices: tuple, grid: tuple, names) -> None:
        """Moves to the grid point ``indices`` (``np.int32``s, what ``pl.program_id``
        returns) of ``grid`` (axis ``names`` or None); the grid loop prepares them once."""
        ctx = self.ctx
        ctx.grid_indices, ctx.grid, ctx.axis_names = indices, grid, names

    # -- race detection ---------------------------------------------------------------
    def access(self, kind: str, buf: Buffer, box, site: str) -> None:
        if self.sim.detect and not (self.local_only and _private(buf)):
            clock = self.sim.clocks.tick(self.gid)
            self.sim.record(self.gid, clock, kind, buf, box, site, self.who)

    # -- memory ---------------------------------------------------------------------------
    def bounds(self, buf: Buffer):
        return buf.storage.shape

    def read(self, buf: Buffer, box, site: str, what: str = "read",
             record: bool = True, copy: bool = True) -> np.ndarray:
        """``box`` of ``buf`` (a copy, or with ``copy=False`` a view of the storage when
        in bounds, for a caller that writes it elsewhere at once)."""
        if record and self.sim.detect:
            self.access("read", buf, box, site)
        index = B.index_in(box, buf.storage.shape)
        if index is None:
            if self.params.out_of_bounds_reads == "raise":
                raise IndexError(
                    f"Out-of-bounds {what} of {buf.origin} ({_space_name(buf)}) "
                    f"on device "
                    f"{self.device} (core {self.core}) at {site}: reading "
                    f"{B.describe(box)} but buffer has shape {buf.shape}."
                )
            fill = B.uninitialized_value(buf.dtype, self.params.uninitialized_memory)
            return B.clipped_read(buf.storage, box, self.bounds(buf), fill)
        data = buf.storage[index]
        return np.array(data) if copy else data

    def write(self, buf: Buffer, box, value, site: str, what: str = "write",
              mask=None, record: bool = True) -> None:
        if record and self.sim.detect:
            self.access("write", buf, box, site)
        storage = buf.storage
        value = np.asarray(value, storage.dtype)
        shape = B.box_shape(box)
        if value.shape != shape:
            value = np.broadcast_to(value, shape)
        index = B.index_in(box, storage.shape)
        if index is not None:
            if mask is None and storage.shape == buf.shape:  # unpadded: all of it
                with self.sim.lock:
                    (buf.own() if buf.borrowed else storage)[index] = value
                return
        elif mask is None or _masked_oob(box, storage.shape, mask):
            raise ValueError(
                f"Out-of-bounds {what} of {buf.origin} ({_space_name(buf)}) on device "
                f"{self.device} (core {self.core}) at {site}: writing "
                f"{B.describe(box)} but buffer has shape {buf.shape} ."
            )
        with self.sim.lock:
            write_clipped(buf, box, value, mask)

    # -- evaluation -----------------------------------------------------------------------
    def eval(self, jaxpr, consts, args) -> list:
        if not self.params.skip_floating_point_ops:
            return program_of(jaxpr)(self, consts, args)
        # Equation by equation, so that each float result can be skipped.
        return walk_jaxpr(jaxpr, consts, args, self.eval_eqn)

    def eval_closed(self, closed, args) -> list:
        return self.eval(closed.jaxpr, closed.consts, args)

    def eval_eqn(self, eqn, invals) -> list:
        prim = eqn.primitive
        fn = RULES.get(prim)
        if fn is not None:
            if prim not in _CONTROL or _needs_engine(eqn, invals):
                return fn(self, eqn, invals)
            return self.jax_call(self.bind, eqn, invals)
        core_rule = interpret_rules.get(prim)
        if core_rule is not None:  # Pallas and TPU primitives (values, PRNG, MXU, ...)
            return self.jax_call(lambda: list(core_rule(self.ctx, eqn, invals)))
        if any(isinstance(x, Buffer) for x in invals):
            raise NotImplementedError(
                f"TPU interpret mode (pallas-tpu) has no rule for the primitive "
                f"'{prim.name}' applied to refs"
            )
        return self.jax_call(self.bind, eqn, invals)

    def bind(self, eqn, invals) -> list:
        prim = eqn.primitive
        if self.params.skip_floating_point_ops:
            skipped = _skip_float(eqn, invals)
            if skipped is not None:
                return skipped
        params = prim.get_bind_params(eqn.params)
        subfuns = params.pop("subfuns", ())
        outs = prim.bind(*subfuns, *invals, **params)
        return list(outs) if prim.multiple_results else [outs]


def _private(buf: Buffer) -> bool:
    key = buf.key
    return isinstance(key, tuple) and len(key) > 3 and key[3] is not None


def write_clipped(buf: Buffer, box, value: np.ndarray, mask=None) -> None:
    """Writes ``value`` into ``box`` of ``buf``: only the part inside the buffer's logical
    shape (padding is never written), and only where ``mask`` is true."""
    logical = buf.shape
    buf.own()
    if not B.out_of_bounds(box, logical):
        idx = B.numpy_index(box)
        if mask is None:
            buf.storage[idx] = value
        else:
            cur = buf.storage[idx]
            buf.storage[idx] = np.where(np.asarray(mask), value, cur)
        return
    # Partly outside: write the in-bounds positions of each dimension (the box is a
    # product of per-dimension ranges, so the in-bounds part is one too).
    full_shape = tuple(d.count for d in box)
    value = np.broadcast_to(value.reshape(
        [d.count if not d.squeezed else 1 for d in box]), full_shape)
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask).reshape(
            [d.count if not d.squeezed else 1 for d in box]), full_shape)
    idx, keep = [], []
    for d, n in zip(box, logical):
        pos = d.start + np.arange(d.count) * d.step
        ok = np.nonzero((pos >= 0) & (pos < n))[0]
        if ok.size == 0:
            return
        idx.append(pos[ok])
        keep.append(ok)
    sub = value[np.ix_(*keep)]
    grid = np.ix_(*idx)
    if mask is not None:
        sub = np.where(mask[np.ix_(*keep)], sub, buf.storage[grid])
    buf.storage[grid] = sub


def _masked_oob(box, bounds, mask) -> bool:
    mask = np.asarray(mask)
    full = tuple(d.count for d in box)
    mask = np.broadcast_to(mask.reshape([d.count if not d.squeezed else 1 for d in box]),
                           full)
    oob = None
    for d, n in zip(box, bounds):
        pos = d.start + np.arange(d.count) * d.step
        bad = (pos < 0) | (pos >= n)
        oob = bad if oob is None else oob[..., None] | bad
    return bool(np.any(oob & mask))


def _skip_float(eqn, invals):
    outs = [v.aval for v in eqn.outvars]
    if outs and all(jax.numpy.issubdtype(a.dtype, jax.numpy.floating) for a in outs):
        return [np.full(a.shape, np.inf, a.dtype) for a in outs]
    return None


# -- grid and mesh positions ------------------------------------------------------------


@rule(program_id_p, num_programs_p)
def _grid_rule(core: Core, eqn, invals):
    axis = eqn.params["axis"]
    if not 0 <= axis < len(core.ctx.grid):  # the core rule raises the error
        return list(interpret_rules[eqn.primitive](core.ctx, eqn, invals))
    if eqn.primitive is program_id_p:
        return [np.int32(core.ctx.grid_indices[axis])]
    return [np.int32(core.ctx.grid[axis])]


GRID_RULE.append(_grid_rule)  # programs inline it for program_id (see plan.GRID_RULE)


@rule(axis_index_p)
def _axis_index_rule(core: Core, eqn, invals):
    name = eqn.params["axis_name"]
    names = core.ctx.axis_names or ()
    if name in names:
        return [np.int32(core.ctx.grid_indices[names.index(name)])]
    if name in core.axis_env:
        return [np.int32(core.axis_env[name])]
    raise NameError(f"TPU interpret mode: unbound axis name {name!r} in the kernel "
                    f"(grid axes {names}, mesh axes {tuple(core.axis_env)})")


# -- refs -----------------------------------------------------------------------------------


_sites: dict = {}


def site_of(eqn) -> str:
    """The kernel source line of ``eqn`` (cached: walking a traceback is slow)."""
    hit = _sites.get(eqn)  # keyed by the equation itself (by identity), never its id()
    if hit is not None:
        return hit
    try:
        site = jc.user_source_location(eqn)
    except Exception:  # noqa: BLE001 - a location is best effort
        site = "<unknown>"
    _sites[eqn] = site
    return site


def view(buf: Buffer, flat, tree):
    """(box, None) for a rectangular view of ``buf``, else (None, transforms)."""
    try:
        box = B.fast_box(buf.shape, flat, tree)
    except B.NotABox:
        box = None
    if box is not None:
        return box, None
    transforms = B.unflatten_transforms(flat, tree)
    try:
        return B.box_of(buf.shape, transforms), None
    except B.NotABox:
        return None, transforms


def check_direct_access(buf: Buffer, what: str) -> None:
    if buf.memory_space in (MemorySpace.ANY, MemorySpace.HBM):
        raise ValueError(
            f"{what}: Buffers with a memory space of HBM or ANY cannot be referenced "
            f"directly. Instead, use `pltpu.sync_copy` or `pltpu.async_copy`."
        )


def _discharged_get(core, buf, flat, tree, site):
    core.access("read", buf, B.full_box(buf.shape), site)
    return np.asarray(jc.get_view(buf.value, list(flat), tree))


def _discharged_set(core, buf, flat, tree, new, site):
    core.access("write", buf, B.full_box(buf.shape), site)
    buf.value = jc.set_view(buf.value, new, list(flat), tree)


@rule(jc.get_p)
def _get_rule(core: Core, eqn, invals):
    buf, *flat = invals
    check_direct_access(buf, "get_p")
    site = site_of(eqn)
    box, _ = view(buf, flat, eqn.params["tree"])
    if box is None:
        return [_discharged_get(core, buf, flat, eqn.params["tree"], site)]
    return [core.read(buf, box, site)]


@rule(jc.swap_p)
def _swap_rule(core: Core, eqn, invals):
    buf, val, *flat = invals
    check_direct_access(buf, "swap_p")
    site = site_of(eqn)
    tree = eqn.params["tree"]
    box, _ = view(buf, flat, tree)
    if box is None:
        old = _discharged_get(core, buf, flat, tree, site)
        _discharged_set(core, buf, flat, tree, val, site)
        return [old]
    old = core.read(buf, box, site) if _used(eqn) else None
    core.write(buf, box, val, site)
    if old is None:  # the old value is dropped: a read-only view of one zero
        old = np.broadcast_to(np.zeros((), buf.dtype), B.box_shape(box))
    return [old]


@rule(jc.addupdate_p)
def _addupdate_rule(core: Core, eqn, invals):
    buf, val, *flat = invals
    check_direct_access(buf, "addupdate_p")
    site = site_of(eqn)
    box, _ = view(buf, flat, eqn.params["tree"])
    if box is None:
        old = _discharged_get(core, buf, flat, eqn.params["tree"], site)
        _discharged_set(core, buf, flat, eqn.params["tree"], old + np.asarray(val), site)
        return []
    old = core.read(buf, box, site)
    core.write(buf, box, old + np.asarray(val, buf.dtype), site)
    return []


_uses: dict = {}


def _used(eqn) -> bool:
    hit = _uses.get(eqn)  # keyed by the equation itself (by identity), never its id()
    if hit is None:
        hit = _uses[eqn] = not all(type(v).__name__ == "DropVar" for v in eqn.outvars)
    return hit


def _split_masked(rest, tree, n_extra):
    n = tree.num_leaves
    return rest[:n], rest[n:]


@rule(load_p)
def _masked_load_rule(core: Core, eqn, invals):
    buf, *rest = invals
    check_direct_access(buf, "load_p")
    tree = eqn.params["tree"]
    flat, extra = _split_masked(rest, tree, 2)
    it = iter(extra)
    mask = next(it) if eqn.params["has_mask"] else None
    other = next(it) if eqn.params["has_other"] else None
    site = site_of(eqn)
    box, _ = view(buf, flat, tree)
    if box is None:
        value = _discharged_get(core, buf, flat, tree, site)
    else:
        value = _read_under_mask(core, buf, box, site, mask)
    if mask is not None:
        fill = other if other is not None else np.zeros_like(value)
        value = np.where(np.asarray(mask), value, fill)
    return [value]


@rule(swap_p)
def _masked_swap_rule(core: Core, eqn, invals):
    buf, val, *rest = invals
    check_direct_access(buf, "swap_p")
    tree = eqn.params["tree"]
    flat, extra = _split_masked(rest, tree, 1)
    mask = extra[0] if eqn.params["has_mask"] else None
    site = site_of(eqn)
    box, _ = view(buf, flat, tree)
    if box is None:
        old = _discharged_get(core, buf, flat, tree, site)
        new = val if mask is None else np.where(np.asarray(mask), val, old)
        _discharged_set(core, buf, flat, tree, new, site)
        return [_exchanged(old, val, mask)]
    old = _read_under_mask(core, buf, box, site, mask)
    core.write(buf, box, val, site, what="masked swap" if mask is not None else "swap",
               mask=mask)
    return [_exchanged(old, val, mask)]


def _read_under_mask(core: Core, buf, box, site: str, mask) -> np.ndarray:
    """``box`` of ``buf`` for a load or swap. With a mask, a box reaching past the buffer
    is no error (its masked-off lanes may lie outside): the outside reads as uninitialized
    memory."""
    if mask is not None and B.out_of_bounds(box, core.bounds(buf)):
        core.access("read", buf, box, site)
        fill = B.uninitialized_value(buf.dtype, core.params.uninitialized_memory)
        return B.clipped_read(buf.storage, box, core.bounds(buf), fill)
    return core.read(buf, box, site)


def _exchanged(old, val, mask):
    """What a swap returns: the old contents where it wrote, ``val`` in masked-off lanes
    (a partial exchange, as upstream's discharge defines it)."""
    return old if mask is None else np.where(np.asarray(mask), old, val)


# -- control flow ------------------------------------------------------------------------


@rule(CF["cond"])
def _cond_rule(core: Core, eqn, invals):
    index, *ops = invals
    branches = eqn.params["branches"]
    i = min(max(int(index), 0), len(branches) - 1)
    return core.eval_closed(branches[i], ops)


COND_RULE.append(_cond_rule)  # programs inline it (see plan.COND_RULE)


@rule(CF["while"])
def _while_rule(core: Core, eqn, invals):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:nc], invals[nc:nc + nb], list(invals[nc + nb:])
    while bool(np.asarray(core.eval_closed(p["cond_jaxpr"], [*cconsts, *carry])[0])):
        carry = core.eval_closed(p["body_jaxpr"], [*bconsts, *carry])
    return carry


@rule(CF["scan"])
def _scan_rule(core: Core, eqn, invals):
    p = eqn.params
    nconsts, ncarry, length = p["num_consts"], p["num_carry"], p["length"]
    consts = invals[:nconsts]
    carry = list(invals[nconsts:nconsts + ncarry])
    xs = invals[nconsts + ncarry:]
    ys = []
    order = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in order:
        outs = core.eval_closed(p["jaxpr"], [*consts, *carry, *[x[i] for x in xs]])
        carry, y = outs[:ncarry], outs[ncarry:]
        ys.append(y)
    if p["reverse"]:
        ys.reverse()
    n_ys = len(eqn.outvars) - ncarry
    stacked = []
    for k in range(n_ys):
        aval = eqn.outvars[ncarry + k].aval
        stacked.append(np.stack([np.asarray(y[k]) for y in ys]) if ys
                       else np.zeros(aval.shape, aval.dtype))
    return [*carry, *stacked]


@rule(CF["jit"])
def _jit_rule(core: Core, eqn, invals):
    return core.eval_closed(eqn.params["jaxpr"], invals)


@rule(CF["closed_call"], CF["custom_jvp_call"], CF["custom_vjp_call"])
def _call_rule(core: Core, eqn, invals):
    return core.eval_closed(eqn.params["call_jaxpr"], invals)


@rule(CF["remat"])
def _remat_rule(core: Core, eqn, invals):
    return core.eval(eqn.params["jaxpr"], (), invals)


def _space_name(buf: Buffer) -> str:
    return getattr(buf.memory_space, "name", str(buf.memory_space))
