"""Barriers and semaphores in GPU interpret mode.

A barrier counts arrivals; every ``num_arrivals`` of them complete a *phase*, which
carries the join of the arrivers' vector clocks. Each thread waits for phases in order
(its first wait is for phase 1, its next for phase 2, ...), acquiring the clock of the
phase it observes. As upstream's interpreter, it reports misuse that would hang or
misbehave on a GPU (whose mbarriers only remember the parity of the phase):

- a phase completing before anyone observed the previous one;
- a thread awaiting a phase when a later one has already completed;
- a thread that waited on a barrier but did not observe all its phases by the end.

Semaphores count; a wait blocks until the count reaches the value, then subtracts it.
The rules of the barrier and semaphore primitives are in :mod:`rules_sync`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from pallas_mosaic_gpu._src.interpret import devices, pairs
from pallas_mosaic_gpu._src.interpret.memory import access_region
from pallas_mosaic_gpu._src.interpret.threads import Blocker
from pallas_mosaic_gpu._src.primitives import refs as R


class BarrierError(RuntimeError):
    """A barrier used in a way that hangs or misbehaves on a GPU."""


def _join(a, b):
    if a is None:
        return None if b is None else b.copy()
    return a if b is None else np.maximum(a, b)


class BarrierState:
    """One mbarrier: arrivals in the current phase, completed phases, who saw what."""

    def __init__(self, num_arrivals: int, label: str):
        self.num_arrivals = num_arrivals
        self.label = label
        self.arrivals = 0
        self.completed = 0
        self.pending_clock = None
        self.phase_clocks: list = []
        self.observed: dict[int, list] = {}  # thread id -> [thread label, phases seen]
        self.seen_phases: set[int] = set()
        # Per completed phase: its tensor-core arrivals ((issuer, seq), ...), or None if
        # a thread or a TMA copy arrived too (see tensor_core_arrive).
        self.phase_tc: list = []
        self.pending_tc: list | None = []
        # Leader-tracked copies: per block of the cluster, the clocks of its parts that
        # have not yet been matched with the other blocks' parts.
        self.tracked: dict[int, list] = {}

    def arrive(self, clock, tc=None) -> None:
        self.pending_clock = _join(self.pending_clock, clock)
        self.arrivals += 1
        if tc is None:
            self.pending_tc = None
        elif self.pending_tc is not None:
            self.pending_tc.append(tc)
        if self.arrivals < self.num_arrivals:
            return
        if self.completed >= 1 and self.completed not in self.seen_phases:
            raise BarrierError(
                "Barrier arrival was completed again before previous completion was observed "
                f"by a thread. ({self.label}: phase {self.completed} completed and no thread "
                f"waited for it before phase {self.completed + 1} completed)")
        self.completed += 1
        self.phase_clocks.append(self.pending_clock)
        self.phase_tc.append(None if self.pending_tc is None else tuple(self.pending_tc))
        self.pending_clock = None
        self.pending_tc = []
        self.arrivals = 0


    def tracked_arrive(self, block: int, blocks: int, clock) -> None:
        """One block's part of a leader-tracked copy (this is the leader's barrier): the
        parts of the ``blocks`` blocks are matched in issue order, and each complete set
        is one arrival carrying the join of their clocks (all its bytes landed)."""
        self.tracked.setdefault(block, []).append(clock)
        if all(self.tracked.get(b) for b in range(blocks)):
            joined = None
            for b in range(blocks):
                joined = _join(joined, self.tracked[b].pop(0))
            self.arrive(joined)


class BarrierArray:
    """The barriers of one ``plgpu.Barrier`` allocation (``num_barriers`` of them)."""

    def __init__(self, shape, space, blocks: int = 1):
        self.shape = tuple(shape)
        self.space = space
        self.arrivals = space.num_arrivals * blocks  # a cluster barrier: every block's
        self.states = {}

    def at(self, buf, flat, tree) -> BarrierState:
        region, ok = access_region(self.shape, flat, tree)
        if not ok:
            raise IndexError(f"barrier index out of range for {buf.name} of shape "
                             f"{self.shape}")
        index = tuple(s for s, _, _ in region)
        state = self.states.get(index)
        if state is None:
            label = buf.name + (f"[{', '.join(map(str, index))}]" if index else "")
            state = self.states[index] = BarrierState(self.arrivals, label)
        return state


class SemaphoreArray:
    """Counts (and the clock of the last signal) of a semaphore allocation."""

    def __init__(self, shape):
        self.counts = np.zeros(shape, np.int64)
        self.clocks: dict = {}


def barrier_of(th, spec, invals) -> BarrierState:
    """The barrier a barrier view names (another block's, through ``plgpu.cluster_ref``)."""
    ((buf, flat, tree),) = R.unflatten(spec, invals)[:1]
    buf, flat, tree = devices.resolve(th, buf, flat, tree, "a barrier operation")
    if buf.sync is None or not isinstance(buf.sync, BarrierArray):
        raise TypeError(f"{buf.name} is not a barrier")
    return buf.sync.at(buf, flat, tree)


def arrive(state: BarrierState, clock) -> None:
    state.arrive(clock)


def tensor_core_arrive(th, *states: BarrierState) -> None:
    """An arrival of the tensor core (``tcgen05_mma``'s barrier, ``tcgen05_commit_arrive``)
    for the tcgen05 operations ``th`` issued so far. They complete in issue order, so a
    thread that observes this arrival knows that every earlier one of the same issuer
    has happened too (``check_barriers_at_exit`` counts their phases as observed).
    Several ``states``: one arrival on each (a CTA pair's multicast commit)."""
    seqs = th.launch.tc_issued
    seqs[th.tid] = seqs.get(th.tid, 0) + 1
    clock = th.release()
    for state in states:  # several: a CTA pair's commit, multicast to both blocks
        state.arrive(clock, tc=(th.tid, seqs[th.tid]))


def wait(th, state: BarrierState):
    """Generator: waits for the next phase of ``state`` that ``th`` has not observed."""
    entry = state.observed.setdefault(th.tid, [th.thread_index, 0])
    target = entry[1] + 1

    def check():
        if state.completed > target:
            raise BarrierError(
                f"Thread {th.thread_index} is awaiting phase {target}, but barrier is already "
                f"at phase {state.completed}. ({state.label}, {th.name})")

    check()
    if state.completed < target:
        yield Blocker(lambda: state.completed >= target,
                      f"phase {target} of barrier {state.label}")
        check()
    entry[1] = target
    state.seen_phases.add(target)
    th.acquire(state.phase_clocks[target - 1])
    done = th.launch.tc_observed
    for issuer, seq in state.phase_tc[target - 1] or ():
        done[issuer] = max(done.get(issuer, 0), seq)


def _known_complete(launch, state: BarrierState, phase: int) -> bool:
    """Whether a phase nobody waited for completed by tensor-core arrivals only, each
    followed by a later arrival of the same issuer that some thread observed (the work
    it signals is then known to be done: upstream's Blackwell matmul leaves the last
    MMAs' arrivals on its "consumed" barriers unobserved, covered by its final commit)."""
    tcs = state.phase_tc[phase - 1]
    done = launch.tc_observed
    return tcs is not None and all(done.get(i, 0) >= s for i, s in tcs)


def check_barriers_at_exit(launch) -> None:
    """Every thread that waited on a barrier must have observed all its phases (phases
    of tensor-core arrivals that a later observed one covers excepted)."""
    for buf in launch.barriers:
        for state in buf.sync.states.values():
            for label, seen in state.observed.values():
                if 0 < seen < state.completed and not all(
                        _known_complete(launch, state, p)
                        for p in range(seen + 1, state.completed + 1)):
                    raise BarrierError(
                        f"Thread {label} did not observe all phases ({state.completed}) for "
                        f"barrier (but observed {seen} phase{'' if seen == 1 else 's'}). "
                        f"({state.label})")


def sem_index(buf, flat, tree):
    region, ok = access_region(buf.shape, flat, tree)
    if not ok:
        raise IndexError(f"semaphore index out of range for {buf.name}")
    if any(e - s != 1 for s, e, _ in region):
        raise ValueError(f"semaphore operations take a single semaphore; index {buf.name}")
    return tuple(s for s, _, _ in region)


def signal(th, buf, idx, tree, inc) -> None:
    """Adds ``inc`` to the semaphore ``buf`` at ``idx`` (releasing ``th``'s clock)."""
    i = sem_index(buf, idx, tree)
    sync = buf.sync
    sync.counts[i] += int(inc)
    sync.clocks[i] = _join(sync.clocks.get(i), th.release())
    buf.value = jnp.asarray(sync.counts, buf.value.dtype)


def peer_barrier(th, view, axis: str, index: int):
    """The barrier state a barrier view names, in the block at ``index`` along ``axis``."""
    buf, flat, tree = pairs.peer_view(th, view, axis, index)
    if not isinstance(buf.sync, BarrierArray):
        raise TypeError(f"{buf.name} is not a barrier")
    return buf.sync.at(buf, flat, tree)
