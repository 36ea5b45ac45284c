"""Lifetimes of ``run_scoped`` SMEM buffers: closed scopes give their bytes back.

A scope's SMEM buffers live while its body runs. The buffers of a scope opened after a
sibling scope has closed start where the sibling's started (they reuse its bytes, as
upstream's ``run_scoped`` allocations do); those of a scope nested in another start
above the outer ones. So the scoped buffers take the bytes of the deepest stack of
live scopes, not their sum. They go in the kernel's SMEM tree as one ``mgpu.Union``
(Mosaic GPU's overlapping allocation): one member per buffer, padded to its offset.
Every buffer starts at its alignment (``smem_tree.alignment``: 1024 bytes for swizzled
ones). Barrier arrays are shared the same way, per type (arrival count, number of
barriers), as upstream's pool of barriers: a scope opened after a sibling took a barrier
array of that type uses the sibling's. Mosaic GPU initialises barriers once, at the
kernel's entry, and each thread follows their phases in registers, counting only the
phases it waited for; so a scope taking over a barrier initialises it again at its
entry (one thread, then a fence and the scope's synchronisation) and every thread
starts its phases at 0 again. Only plain barriers are shared: a cluster barrier gets
arrivals from other blocks, a tensor-core one from MMAs still running. TMEM addresses
are not shared. Like its buffers, a scope's barriers must have no arrival in flight
when it closes (every TMA load it issued waited for), as a loop around it needs too.

Reusing bytes is only sound once every thread is done with the old buffer, so a scope
whose bytes (or barriers) another scope may have used before it (an earlier sibling, or any overlapping
scope when both sit in one loop) synchronises at its entry: the warpgroup (a block
barrier when the block has several warpgroups), after waiting for the TMA stores a
scope may have left reading its buffers (``copy_smem_to_gmem`` not followed by
``wait_smem_to_gmem(0)``); not needed after a scope (or a scope around it) that ended
with ``wait_smem_to_gmem(0)``, which waits for those stores and synchronises the
warpgroup. A scope that only some threads run keeps bytes of its own
(inside ``pl.core_map`` over warps; and, in a block of several warpgroups, under a
``cond`` or ``while``, which may be one warpgroup's code): no barrier could be reached
by all threads there.
"""

from __future__ import annotations

import dataclasses

import jax.extend.core as jex
from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import gpu, memref, nvvm

from pallas import plugins
from pallas_mosaic_gpu._src.lowering import smem_tree
from pallas_mosaic_gpu._src.primitives.copies import copy_smem_to_gmem_p, wait_smem_to_gmem_p

LOOPS = ("while", "scan")  # primitives whose bodies run repeatedly
DIVERGENT = ("cond", "while")  # may run on some warpgroups only (in multi-warpgroup blocks)


@dataclasses.dataclass(frozen=True)
class Sync:
    """What a scope does at its entry before reusing bytes or barriers."""

    block: bool  # a block barrier (several warpgroups), else the warpgroup's
    stores: bool  # first wait for TMA stores still reading SMEM
    # Its barrier arrays (keys ``(id(eqn), k)``) that an earlier scope used: initialised
    # again (then a fence and a second barrier), every thread's phases back to 0.
    barriers: tuple = ()


@dataclasses.dataclass
class Stack:
    """The shared scoped buffers: the union (None: none shared), the member of each
    buffer ``(id(eqn), k)``, the scopes that synchronise at their entry, and the barrier
    arrays that are another scope's (key -> the key whose SMEM entry they use)."""

    union: mgpu.Union | None
    member: dict
    syncs: dict  # id(run_scoped eqn) -> Sync
    barrier_of: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Scope:
    eqn: int
    lo: int
    hi: int
    ancestors: frozenset
    loops: frozenset
    order: int
    leaves_stores: bool
    slots: frozenset = frozenset()  # the barrier pool slots it takes


def _shareable_barrier(p) -> bool:
    """Whether a scoped barrier array may be another scope's: a plain ``mgpu.Barrier``
    (a cluster barrier gets arrivals from other blocks, which no barrier of this block
    orders; a tensor-core one from MMAs still running)."""
    return p.kind == "barrier" and type(p.entry) is mgpu.Barrier and \
        not p.entry.orders_tensor_core


def plan_stack(jaxpr, scoped: dict, num_threads: int, repeated: bool = False) -> Stack:
    """Offsets of the SMEM buffers of ``scoped`` (``{(id(eqn), k): Planned}``, see
    ``scoped.plan``) that the scopes of ``jaxpr`` may share, and the scopes' syncs
    (``repeated``: the kernel runs ``jaxpr`` in a loop, over sequential grid axes)."""
    offsets: dict = {}
    scopes: list[_Scope] = []
    synced: set = set()  # scopes whose body ends with every thread done with SMEM
    owner: dict = {}  # barrier pool slot (type, i) -> the first key that took it
    slot_of: dict = {}  # barrier key -> its pool slot

    def walk(j, base, pool, ancestors, loops, divergent):
        for eqn in j.eqns:
            subs = [getattr(s, "jaxpr", s) for s in jex.jaxprs_in_params(eqn.params)]
            if eqn.primitive is plugins.run_scoped_p:
                keys = [(id(eqn), k) for k in range(len(eqn.params["types"]))
                        if scoped.get((id(eqn), k)) is not None
                        and scoped[(id(eqn), k)].kind == "smem"]
                bars = [(id(eqn), k) for k in range(len(eqn.params["types"]))
                        if scoped.get((id(eqn), k)) is not None
                        and _shareable_barrier(scoped[(id(eqn), k)])]
                if num_threads == 1 and not divergent and _ends_synced(subs[0]):
                    synced.add(id(eqn))
                top, inner = base, dict(pool)
                if (keys or bars) and not divergent:
                    for key in keys:
                        size = smem_tree.buffer_bytes(scoped[key].entry)
                        top += (-top) % smem_tree.alignment(size)
                        offsets[key] = top
                        top += size
                    for key in bars:  # a stack of barrier arrays per type, as of bytes
                        kind = (scoped[key].entry, scoped[key].copies)
                        slot_of[key] = (kind, inner.get(kind, 0))
                        owner.setdefault(slot_of[key], key)
                        inner[kind] = inner.get(kind, 0) + 1
                    lo = offsets[keys[0]] if keys else top
                    scopes.append(_Scope(id(eqn), lo, top, ancestors, loops, len(scopes),
                                         _leaves_stores(subs[0]),
                                         frozenset(slot_of[k] for k in bars)))
                for s in subs:
                    walk(s, top, inner, ancestors | {id(eqn)}, loops, divergent)
                continue
            name = eqn.primitive.name
            inner_loops = loops | {id(eqn)} if name in LOOPS else loops
            inner_div = divergent or eqn.primitive is plugins.core_map_p or (
                num_threads > 1 and name in DIVERGENT)
            for s in subs:
                walk(s, base, pool, ancestors, inner_loops, inner_div)

    walk(jaxpr, 0, {}, frozenset(), frozenset({0} if repeated else ()), False)
    syncs = {}
    for x in scopes:
        others = [y for y in scopes
                  if y is not x and y.eqn not in x.ancestors and x.eqn not in y.ancestors
                  and (y.order < x.order or x.loops & y.loops)]
        before = [y for y in others if y.lo < x.hi and x.lo < y.hi
                  and not any(s in synced and s not in x.ancestors
                              for s in (y.eqn, *y.ancestors))]
        taken = x.slots & frozenset().union(*(y.slots for y in others))
        bars = tuple(k for k, sl in slot_of.items() if k[0] == x.eqn and sl in taken)
        if before or bars:
            syncs[x.eqn] = Sync(num_threads > 1, any(y.leaves_stores for y in before),
                                bars)
    barrier_of = {k: owner[sl] for k, sl in slot_of.items() if owner[sl] != k}
    if not offsets:
        return Stack(None, {}, syncs, barrier_of)
    members, member = [], {}
    for key, off in offsets.items():
        member[key] = len(members)
        members.append((smem_tree.padding(off), scoped[key].entry) if off
                       else (scoped[key].entry,))
    return Stack(mgpu.Union(members), member, syncs, barrier_of)


def _ends_synced(j) -> bool:
    """Whether ``j`` ends with ``wait_smem_to_gmem(0)``: every TMA store done reading
    and the warpgroup synchronised (``rules_tma``), so a scope opened after it may reuse
    its bytes without synchronising again."""
    return bool(j.eqns) and j.eqns[-1].primitive is wait_smem_to_gmem_p and int(
        j.eqns[-1].params["n"]) == 0


def _leaves_stores(j) -> bool:
    """Whether running ``j`` may leave a TMA store (SMEM -> GMEM) still reading SMEM:
    a ``copy_smem_to_gmem`` not followed, at the same level, by a wait for all."""
    pending = False
    for eqn in j.eqns:
        if eqn.primitive is copy_smem_to_gmem_p:
            pending = True
        elif eqn.primitive is wait_smem_to_gmem_p and int(eqn.params["n"]) == 0:
            pending = False
        elif any(_leaves_stores(getattr(s, "jaxpr", s))
                 for s in jex.jaxprs_in_params(eqn.params)):
            pending = True
    return pending


def buffer(union_ref, index: int):
    """The SMEM memref of member ``index`` of the union's refs (after its padding)."""
    return union_ref.members[index][-1]


def enter(sync: Sync | None, barriers=()) -> None:
    """Emits a scope's synchronisation at its entry (nothing when it reuses no bytes or
    barriers); ``barriers``: ``(BarrierRef, arrival count)`` of each of
    ``sync.barriers``."""
    if sync is None:
        return
    if sync.stores:  # the issuing thread's stores; a no-op on threads that issued none
        nvvm.cp_async_bulk_wait_group(0, read=True)
    sync_threads = gpu.barrier if sync.block else mgpu.warpgroup_barrier
    sync_threads()
    if barriers:
        _initialise_again(barriers)
        sync_threads()  # every thread sees them initialised before using them


def _initialise_again(refs) -> None:
    """Initialises barrier arrays an earlier scope used, as Mosaic GPU does at the
    kernel's entry (one thread of the block), and sets every thread's phases back to 0:
    a thread that never waited on a barrier in the earlier scope (the warp-specialised
    pipeline's memory warpgroup on ``full``) did not follow its phases there."""
    from jax.experimental.mosaic.gpu import utils

    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    one = utils.single_thread_predicate(scope=utils.ThreadSubset.BLOCK)
    for ref, count in refs:
        for i in range(ref.num_barriers):
            addr = utils.getelementptr(ref.base_address, [i], i64)
            nvvm.mbarrier_init(addr, utils.c(count, i32), predicate=one)
        memref.store(utils.c(0, i32), ref.phases, [])
    nvvm.fence_mbarrier_init()
