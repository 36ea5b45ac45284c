"""The interpreter's model of vector subcores that meet at ``plsc.subcore_barrier``.

Used for a ``pl.kernel`` over a ``VectorSubcoreMesh`` whose body calls
``subcore_barrier`` or allocates ``VMEM_SHARED`` (scratch or ``pl.run_scoped``), a
``pallas_call`` over a ``(cores, subcores)`` grid that calls ``subcore_barrier``, and
``pl.core_map`` over a ``VectorSubcoreMesh`` under ``pl.run_state``.

- The subcores of a SparseCore run as coroutines, scheduled deterministically: each
  runs (subcore 0 first) until it reaches a barrier; when all are there, they go on
  together to the next one. The time between two barriers is a *phase*.
- Memory that subcores share (``VMEM_SHARED``, and the kernel's outputs in HBM) is seen
  by each subcore through its own view during a phase: its own writes, and everybody's
  writes from earlier phases. At a barrier (and at the end) the views are merged, so a
  value written before a barrier is read by every subcore after it. Reading another
  subcore's write *without* a barrier in between therefore gives the value from before
  the phase (with ``pl.enable_uninitialized_checks``-style checks on, reading an element
  nobody had written yet is reported); two subcores writing different values to one
  element in one phase is a race, reported when the interpreter's checks are on (the
  higher subcore's value wins otherwise). A DMA with ``add=True`` is an atomic
  accumulate on hardware: each view keeps its subcore's adds apart, and the merge sums
  every subcore's adds onto the element (a plain write by one subcore and an add by
  another in one phase is a reported race; the adds land on the written value).
- ``VMEM`` scratch and semaphores are private to a subcore; ``SMEM`` is one buffer per
  SparseCore updated at once (what ``fetch_and_add`` needs); the inputs are read-only.
- SparseCores run one after another. Every subcore must reach the same barriers: one
  finishing while others wait is a clear error (it hangs on hardware). Barriers inside
  ``scan``/``fori_loop``/``pl.loop`` with a static trip count, ``plsc.parallel_loop`` with
  constant bounds, ``pl.run_scoped`` and ``jax.jit`` calls are followed; inside ``cond``
  or a ``while`` whose trip count is traced they are a NotImplementedError.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas.plugins import (
    Cell,
    Checks,
    KernelContext,
    MemoryRef,
    fresh_cell,
    interpret_rules,
    run_scoped_p,
)
from pallas_tpu import CoreType, MemorySpace
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.dma_checks import check_indexed_dmas
from pallas_tpu_sparsecore._src.primitives.control import subcore_barrier_p

_CALLS = {"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
          "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}


class SubcoreBarrierError(ValueError):
    """Subcores did not all reach the same ``subcore_barrier`` (a hang on hardware)."""


# The meshes of ``_src/mesh.py`` (which sits above this module: its
# ``discharge_core_map`` runs ``run_core_map``) are recognised by their core type.
_SPARSECORE_TYPES = (CoreType.SC_SCALAR_SUBCORE, CoreType.SC_VECTOR_SUBCORE)


def _core_type(mesh):
    return getattr(mesh, "core_type", None) if mesh is not None else None


def _sub_jaxprs(eqn):
    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, jax.extend.core.ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jax.extend.core.Jaxpr):
                yield x


@functools.lru_cache(maxsize=256)
def _uses(jaxpr) -> tuple[bool, bool]:
    """(calls subcore_barrier, allocates VMEM_SHARED with run_scoped), anywhere inside."""
    barrier = shared = False
    for eqn in jaxpr.eqns:
        if eqn.primitive is subcore_barrier_p:
            barrier = True
        if eqn.primitive is run_scoped_p and any(
                t.memory_space is MemorySpace.VMEM_SHARED for t in eqn.params["types"]):
            shared = True
        for sub in _sub_jaxprs(eqn):
            b, s = _uses(sub)
            barrier, shared = barrier or b, shared or s
    return barrier, shared


def needs_model(jaxpr, gm) -> bool:
    """Whether the kernel runs under this model: a ``pl.kernel`` over a
    ``VectorSubcoreMesh`` that uses barriers or ``VMEM_SHARED``, or a ``pallas_call``
    over a ``(cores, subcores)`` grid with whole operands that calls
    ``subcore_barrier``. Other kernels run their mesh points in order."""
    if len(gm.grid) != 2 or gm.num_scalar_prefetch:
        return False
    barrier, shared = _uses(jaxpr.jaxpr)
    if _core_type(gm.mesh) is CoreType.SC_VECTOR_SUBCORE:
        return barrier or shared or any(
            t.memory_space is MemorySpace.VMEM_SHARED for t in gm.scratch_types)
    whole = all(tuple(bm.block_shape) == tuple(bm.array_aval.shape)
                for bm in gm.block_mappings)
    return gm.mesh is None and barrier and whole


def schedule(args, *, jaxpr, grid_mapping, checks, errors):
    """The interpreter schedule this package registers (``register_interpret_schedule``);
    it also checks the indexed DMAs of every SparseCore-mesh kernel first."""
    if _core_type(grid_mapping.mesh) in _SPARSECORE_TYPES:
        check_indexed_dmas(jaxpr.jaxpr)
    if not needs_model(jaxpr, grid_mapping):
        return None
    return run_kernel(args, jaxpr=jaxpr, grid_mapping=grid_mapping, checks=checks,
                      errors=errors)


# ------------------------------------------------------------------------------------
# Shared memory: a base and one view per subcore, merged at barriers.


def _bits(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
        return lax.bitcast_convert_type(x, width)
    return x


class _View(Cell):
    """One subcore's view of a shared buffer during a phase. Beside its contents it
    keeps what the subcore's add-DMAs contributed (``delta``, from zero) and what it
    would hold had the subcore only added (``added_only``, from the phase's start): an
    element whose contents differ from ``added_only`` was written plainly. Both travel
    with the contents through control flow (``state``/``fork``)."""

    __slots__ = ("delta", "added_only")

    @classmethod
    def of(cls, base: Cell) -> _View:
        v = cls(base.value, base.origin, base.init, base.memory_space, base.block)
        v.reset(base)
        return v

    def reset(self, base: Cell) -> None:
        """Starts a phase: the base's contents, nothing added."""
        self.value, self.init = base.value, base.init
        self.delta = jnp.zeros_like(base.value)
        self.added_only = base.value

    def accumulate(self, add) -> None:
        self.value, self.delta, self.added_only = (
            add(self.value), add(self.delta), add(self.added_only))

    def state(self) -> tuple:
        return (*super().state(), self.delta, self.added_only)

    def set_state(self, state) -> None:
        super().set_state(state[:-2])
        self.delta, self.added_only = state[-2:]

    def fork(self, state) -> _View:
        v = _View(state[0], self.origin, None, self.memory_space, self.block)
        if self.init is not None:
            v.init = state[1]
        v.delta, v.added_only = state[-2:]
        return v


class Shared:
    """A buffer the subcores of a SparseCore share, seen through per-subcore views."""

    def __init__(self, base: Cell):
        self.base = base
        self.views: dict[int, _View] = {}

    def view(self, s: int) -> _View:
        if s not in self.views:
            self.views[s] = _View.of(self.base)
        return self.views[s]

    def merge(self, report) -> None:
        """Folds every subcore's writes of this phase into the base; refreshes views.

        A plain write replaces the element (the highest subcore's wins; two different
        values are a race). An add-DMA is an atomic accumulate on hardware: every
        subcore's adds land, summed onto the element (onto a plain write of another
        subcore too, which is a race)."""
        base = self.base
        old = base.value
        shape = jnp.shape(old)
        new_init = base.init
        plain_val = old
        plain_any = jnp.zeros(shape, jnp.bool_)
        clash = jnp.zeros(shape, jnp.bool_)
        plain, adds = {}, {}
        for s in sorted(self.views):
            v = self.views[s]
            wrote = _bits(v.value) != _bits(v.added_only)
            if v.init is not None and base.init is not None:
                wrote = wrote | (v.init & ~base.init)
                new_init = new_init | v.init
            clash = clash | (wrote & plain_any & (_bits(v.value) != _bits(plain_val)))
            plain_any = plain_any | wrote
            plain_val = jnp.where(wrote, v.value, plain_val)
            # Adds of a subcore that also wrote the element plainly are in its contents.
            plain[s], adds[s] = wrote, (_bits(v.delta) != 0) & ~wrote
        report(~jnp.any(clash), f"two vector subcores wrote different values to one element "
                                f"of {base.origin} between two plsc.subcore_barrier calls "
                                f"(a race)")
        new = plain_val
        fresh = ~plain_any  # still as the phase began: the first adder's contents go in
        mixed = jnp.zeros(shape, jnp.bool_)
        for s in sorted(self.views):
            v, a = self.views[s], adds[s]
            new = jnp.where(a & fresh, v.added_only, jnp.where(a, new + v.delta, new))
            fresh = fresh & ~a
            mixed = mixed | (a & plain_any & ~plain[s])
        report(~jnp.any(mixed), f"a vector subcore's DMA with add=True and another "
                                f"subcore's plain write to one element of {base.origin} "
                                f"between two plsc.subcore_barrier calls (a race)")
        base.value, base.init = new, new_init
        for v in self.views.values():
            v.reset(base)


# ------------------------------------------------------------------------------------
# One subcore's program, as a generator that yields at each barrier.


class _Subcore:
    def __init__(self, ctx: KernelContext, index: int, core: _Core):
        self.ctx = ctx
        self.index = index
        self.core = core
        self.allocations: dict[int, int] = {}

    def alloc(self, eqn) -> list[Cell]:
        k = self.allocations.get(id(eqn), 0)
        self.allocations[id(eqn)] = k + 1
        cells = []
        for i, t in enumerate(eqn.params["types"]):
            if t.memory_space is MemorySpace.VMEM_SHARED:
                key = (id(eqn), k, i)
                if key not in self.core.scoped:
                    self.core.scoped[key] = self.core.add_shared(
                        fresh_cell(t, f"run_scoped VMEM_SHARED buffer {i}",
                                   self.ctx.check_uninitialized))
                cells.append(self.core.scoped[key].view(self.index))
            else:
                cells.append(fresh_cell(t, f"run_scoped buffer {i}",
                                        self.ctx.check_uninitialized))
        return cells

    def run(self, jaxpr, consts, args):
        env = {}

        def read(v):
            return v.val if isinstance(v, jc.Literal) else env[v]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            if eqn.primitive is subcore_barrier_p:
                yield eqn
                outs = []
            elif eqn.primitive is run_scoped_p and (any(_uses(eqn.params["jaxpr"])) or any(
                    t.memory_space is MemorySpace.VMEM_SHARED for t in eqn.params["types"])):
                outs = yield from self.run(eqn.params["jaxpr"], (),
                                           [*invals, *self.alloc(eqn)])
            elif any(_uses(j)[0] for j in _sub_jaxprs(eqn)):
                outs = yield from self.structured(eqn, invals)
            else:
                outs = self.one(eqn, invals)
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    def one(self, eqn, invals):
        rule = interpret_rules.get(eqn.primitive)
        if rule is not None:
            return rule(self.ctx, eqn, invals)
        if any(isinstance(x, Cell) for x in invals):
            raise NotImplementedError(f"The Pallas interpreter has no rule for the primitive "
                                      f"'{eqn.primitive.name}' applied to refs")
        params = eqn.primitive.get_bind_params(eqn.params)
        subfuns = params.pop("subfuns", ())
        outs = eqn.primitive.bind(*subfuns, *invals, **params)
        return list(outs) if eqn.primitive.multiple_results else [outs]

    def structured(self, eqn, invals):
        """Control flow with a barrier inside, unrolled in Python where it is static."""
        name, p = eqn.primitive.name, eqn.params
        if name in _CALLS:
            j = next(iter(p[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in p))
            consts = j.consts if isinstance(j, jax.extend.core.ClosedJaxpr) else ()
            return (yield from self.run(getattr(j, "jaxpr", j), consts, invals))
        if name == "scan":
            nc, nk = p["num_consts"], p["num_carry"]
            consts, carry, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]
            body = p["jaxpr"]
            ys = []
            steps = range(p["length"])
            for i in (reversed(steps) if p["reverse"] else steps):
                outs = yield from self.run(body.jaxpr, body.consts,
                                           [*consts, *carry, *(x[i] for x in xs)])
                carry, y = outs[:nk], outs[nk:]
                ys.append(y)
            if p["reverse"]:
                ys.reverse()
            stacked = [jnp.stack(col) for col in zip(*ys)] if ys else [
                jnp.zeros((0, *v.aval.shape), v.aval.dtype) for v in eqn.outvars[nk:]]
            return [*carry, *stacked]
        if name == "cond":
            index = _static(invals[0], "cond predicate")
            branch = p["branches"][min(max(index, 0), len(p["branches"]) - 1)]
            return (yield from self.run(branch.jaxpr, branch.consts, invals[1:]))
        if name == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            cconsts, bconsts, carry = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
            cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
            while True:
                go = yield from self.run(cj.jaxpr, cj.consts, [*cconsts, *carry])
                if not _static(go[0], "while condition"):
                    return list(carry)
                carry = yield from self.run(bj.jaxpr, bj.consts, [*bconsts, *carry])
        if name == "sc_parallel_loop":
            lo, hi, st = (_static(x, "plsc.parallel_loop bounds") for x in invals[:3])
            n = p["num_consts"]
            consts, carry = invals[3:3 + n], invals[3 + n:]
            for i in range(lo, hi, st):
                carry = yield from self.run(p["jaxpr"], (), [*consts, jnp.int32(i), *carry])
            return list(carry)
        raise NotImplementedError(
            f"plsc.subcore_barrier inside '{name}': the interpreter follows barriers in "
            f"straight-line code, jax.jit calls, pl.run_scoped, scan, and cond/while/"
            f"plsc.parallel_loop whose predicate or bounds depend only on constants and "
            f"lax.axis_index; move the barrier out of the {name}")


def _static(x, what: str) -> int:
    """``x`` as a Python int; a barrier under control flow that depends on data (not
    only on constants and the subcore's index) cannot be followed."""
    if isinstance(x, jax.core.Tracer):
        raise NotImplementedError(
            f"plsc.subcore_barrier under control flow whose {what} depends on array data: "
            f"the interpreter follows barriers under control flow that depends only on "
            f"constants and lax.axis_index")
    return int(x)


# ------------------------------------------------------------------------------------
# A SparseCore: its subcores and shared buffers; the kernel: the cores in order.


class _Core:
    def __init__(self):
        self.shared: list[Shared] = []
        self.scoped: dict[tuple, Shared] = {}

    def add_shared(self, base: Cell) -> Shared:
        buf = Shared(base)
        self.shared.append(buf)
        return buf


def run_kernel(args, *, jaxpr, grid_mapping, checks, errors):
    """Runs a vector-subcore ``pl.kernel`` under the model above: (outputs, error vector
    or None)."""
    gm = grid_mapping
    n_cores, n_sub = gm.grid
    names = tuple(gm.grid_names or ("core", "subcore"))
    track = bool(checks.uninitialized)
    err_cell = None
    if errors is not None:
        err_cell = Cell(jnp.zeros((1 + errors.payload_size,), jnp.int32), "errors")
    ins = [Cell(x, bm.origin, None, bm.memory_space)
           for x, bm in zip(args[gm.num_scalar_prefetch:], gm.in_block_mappings)]
    aliased = {o: i - gm.num_scalar_prefetch for i, o in gm.input_output_aliases}
    outs = []
    for o, bm in enumerate(gm.out_block_mappings):
        if o in aliased:
            init = jnp.ones(bm.array_aval.shape, jnp.bool_) if track else None
            cell = Cell(ins[aliased[o]].value, bm.origin, init, bm.memory_space)
        else:
            t = MemoryRef(jax.core.ShapedArray(bm.array_aval.shape, bm.array_aval.dtype),
                          bm.memory_space)
            cell = fresh_cell(t, bm.origin, track)
        outs.append(Shared(cell))
    layout = [("in", x) for x in ins] + [("shared", b) for b in outs]
    _run_cores(jaxpr.jaxpr, jaxpr.consts, layout, tuple(gm.grid), names,
               list(zip(gm.scratch_types, gm.scratch_origins)), checks, errors, err_cell)
    return [b.base.value for b in outs], (None if err_cell is None else err_cell.value)


def _run_cores(jaxpr, consts, layout, grid, names, scratch, checks, errors,
               err_cell) -> None:
    """Runs ``jaxpr(*operands, *scratch)`` on every (core, subcore) of ``grid``.

    ``layout`` lists the operands: ``("in", x)`` the same value or cell for every subcore,
    ``("shared", Shared)`` a buffer every subcore sees through its view. ``scratch`` is
    ``[(MemoryRef, origin)]``.
    """
    n_cores, n_sub = grid
    track = bool(checks.uninitialized)
    for c in range(n_cores):
        core = _Core()
        core.shared.extend(b for kind, b in layout if kind == "shared")
        smem, vshared = {}, {}
        for k, (t, origin) in enumerate(scratch):
            if t.memory_space is MemorySpace.SMEM:
                smem[k] = fresh_cell(t, origin, track)
            elif t.memory_space is MemorySpace.VMEM_SHARED:
                vshared[k] = core.add_shared(fresh_cell(t, origin, track))
        subcores = []
        for s in range(n_sub):
            ctx = KernelContext((c, s), grid, errors=errors, error_cell=err_cell,
                                check_uninitialized=track, debug_checks=bool(checks.debug),
                                axis_names=names)
            sub = _Subcore(ctx, s, core)
            mine = []
            for k, (t, origin) in enumerate(scratch):
                if k in smem:
                    mine.append(smem[k])
                elif k in vshared:
                    mine.append(vshared[k].view(s))
                else:
                    mine.append(fresh_cell(t, origin, track))
            refs = [b.view(s) if kind == "shared" else b for kind, b in layout]
            subcores.append((sub, sub.run(jaxpr, consts, [*refs, *mine])))
        _schedule(c, subcores, core, err_cell)
        for kind, b in layout:
            if kind == "shared":
                b.views.clear()


def run_core_map(mesh, in_avals, args, params):
    """``pl.core_map`` over a ``VectorSubcoreMesh`` outside a kernel (under
    ``pl.run_state``), under the same model: the refs it closes over are shared buffers.
    Returns the refs' new values (None for non-refs)."""
    layout = []
    for i, (x, aval) in enumerate(zip(args, in_avals)):
        if isinstance(aval, jc.AbstractRef):
            layout.append(("shared", Shared(Cell(x, f"core_map operand {i}", None,
                                                 getattr(aval, "memory_space", None)))))
        else:
            layout.append(("in", x))
    scratch = [(t, f"core_map scratch {i}") for i, t in enumerate(params["scratch_types"])]
    names, sizes = tuple(mesh.shape), tuple(mesh.shape.values())
    _run_cores(params["jaxpr"], (), layout, sizes, names, scratch, Checks(), None, None)
    return [b.base.value if kind == "shared" else None for kind, b in layout]


def _schedule(core_index, subcores, core: _Core, err_cell) -> None:
    """Resumes every subcore to its next barrier, merges, repeats until all finish."""
    phase = 0
    while True:
        at_barrier, done = [], []
        for sub, gen in subcores:
            try:
                with jc.eager_constant_folding(True):
                    next(gen)
                at_barrier.append(sub.index)
            except StopIteration:
                done.append(sub.index)
        ctx0 = subcores[0][0].ctx
        for buf in core.shared:
            buf.merge(ctx0.report if err_cell is not None else _ignore)
        if not at_barrier:
            return
        if done:
            raise SubcoreBarrierError(
                f"plsc.subcore_barrier: on SparseCore {core_index}, vector subcores "
                f"{done} finished while subcores {at_barrier} wait at barrier number "
                f"{phase + 1}; every vector subcore of a SparseCore must reach every "
                f"barrier (on hardware this hangs)")
        phase += 1


def _ignore(ok, message) -> None:
    del ok, message
