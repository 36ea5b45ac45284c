"""The threads of one CUDA block (or cluster) run as coroutines ("strands"): each
warpgroup, or each warp, its own SIMT machine in lockstep.

On a GPU the warpgroups of a block, and the warps of a warpgroup, make progress
independently and meet only at synchronisation: mbarrier waits, named barriers
(``bar.sync``), ``__syncthreads``. The executor runs each strand until it must wait for
something another strand (or a copy) has not done yet, then switches to the next one
that can go on, round robin; so a warp-specialised kernel (a producer warpgroup issuing
TMA copies, a consumer waiting on their barriers and releasing the slots) runs as it
does on the hardware. Exactly one strand runs at a time (a baton passed between Python
threads), so runs are deterministic.

A strand is a warpgroup (128 threads) by default. Lanes of a strand that diverge are
run one side after the other (``ops_scf``); a side that waits while lanes of the same
strand are *parked* (they skipped a branch, or left a loop, and go on only after it)
may be waiting for those very lanes: a ``plgpu.WarpMesh`` producer warp issuing TMA
copies and MMAs, a consumer warp waiting on the mbarrier the producer arrives on. When
that wait cannot complete, the run stops with :class:`DivergentWait`, and the launcher
runs the kernel again from the start with a strand per warp (32 threads) for that
warpgroup: its warps then make progress on their own, as on the hardware. Warpgroups
whose lanes never wait for parked lanes keep the faster warpgroup strands (and can
issue warpgroup-wide ``wgmma``). When every unfinished strand waits for
something no one can do any more and none has parked lanes, the wait is a deadlock
(:class:`EmulationError`); with parked lanes even with a strand per warp (lanes of one
warp waiting for each other), :class:`EmulationUnsupported`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from pallas_mosaic_gpu._src.executor.types import EmulationError, EmulationUnsupported

WARPGROUP = 128


class DivergentWait(EmulationUnsupported):
    """A warpgroup strand waits for something only its own parked lanes could do: the
    kernel needs a strand per warp for ``warpgroups`` (their indices in the block)."""

    def __init__(self, message: str, warpgroups: set[int]):
        super().__init__(message)
        self.warpgroups = warpgroups


class _Group:
    __slots__ = ("index", "name", "machine", "blocked", "done", "error", "abort", "thread")

    def __init__(self, index, machine, name):
        self.index, self.machine, self.name = index, machine, name
        self.blocked = None  # (condition, description) while waiting
        self.done = False
        self.error = None
        self.abort = None
        self.thread = None


class Block:
    """Runs ``fn(machine)`` for every warpgroup machine of a block, switching between
    them where they wait."""

    def __init__(self, machines, names=None):
        names = names or [f"warpgroup {i}" for i in range(len(machines))]
        self.groups = [_Group(i, m, n) for i, (m, n) in enumerate(zip(machines, names))]
        for g in self.groups:
            g.machine.block = self
            g.machine.group = g.index
        self.barriers: dict = {}  # named barrier id -> [threads arrived, generation]
        self._cv = threading.Condition()
        self._turn = None

    # -- what ops call

    def wait_until(self, m, cond: Callable[[], bool], what: Callable[[], str]) -> None:
        """Returns once ``cond()`` holds, letting the other warpgroups run meanwhile."""
        while not cond():
            g = self.groups[m.group]
            if len(self.groups) == 1:
                raise self._deadlock([(g, what)])
            self._yield(g, cond, what)

    def barrier(self, m, key, expected: int, name: str) -> None:
        """``bar.sync``/``__syncthreads``: this warpgroup's active threads arrive at
        barrier ``key``; returns when ``expected`` threads have arrived."""
        arriving = m.threads if m.mask is None else int(np.count_nonzero(m.mask))
        st = self.barriers.setdefault((m.smem, key), [0, 0])  # per block of a cluster
        gen = st[1]
        st[0] += arriving
        if st[0] > expected:
            raise EmulationError(f"{st[0]} threads arrived at {name}, which expects "
                                 f"{expected}")
        if st[0] == expected:
            st[0], st[1] = 0, gen + 1
            return
        self.wait_until(m, lambda: st[1] != gen,
                        lambda: f"{name}: {st[0]} of {expected} threads have arrived")

    # -- running

    def run(self, fn: Callable) -> None:
        if len(self.groups) == 1:
            fn(self.groups[0].machine)
            return
        for g in self.groups:
            g.thread = threading.Thread(target=self._worker, args=(g, fn), daemon=True)
            g.thread.start()
        last = -1
        error = None
        while True:
            live = [g for g in self.groups if not g.done]
            if not live:
                break
            n = len(self.groups)
            order = [self.groups[(last + 1 + k) % n] for k in range(n)]
            ready = next((g for g in order if not g.done and
                          (g.blocked is None or g.blocked[0]())), None)
            if ready is None:
                error = self._deadlock([(g, g.blocked[1]) for g in live])
                break
            self._resume(ready)
            last = ready.index
            if ready.error is not None:
                error = ready.error
                break
        if error is not None:
            for g in self.groups:
                if not g.done:
                    g.abort = error
                    self._resume(g)
        for g in self.groups:
            g.thread.join()
        if error is not None:
            raise error

    def _resume(self, g) -> None:
        with self._cv:
            self._turn = g.index
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn is None)

    def _worker(self, g, fn) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self._turn == g.index)
        try:
            if g.abort is None:
                with np.errstate(all="ignore"):
                    fn(g.machine)
        except BaseException as e:  # noqa: BLE001 - handed to the scheduler
            if g.abort is None:
                g.error = e
        finally:
            g.done = True
            with self._cv:
                self._turn = None
                self._cv.notify_all()

    def _yield(self, g, cond, what) -> None:
        g.blocked = (cond, what)
        with self._cv:
            self._turn = None
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn == g.index)
        g.blocked = None
        if g.abort is not None:
            raise _Aborted()

    def _deadlock(self, waiting) -> Exception:
        lines = "; ".join(f"{g.name} waits: {what()}" for g, what in waiting)
        parked = [g for g, _ in waiting if g.machine.mask is not None
                  and not g.machine.mask.all()]
        if parked:
            whole = {g.machine.warpgroup for g in parked if not g.machine.is_warp}
            unit = "warpgroup" if whole else "warp"
            message = (f"{parked[0].name} waits while some of its threads are parked at a "
                       f"reconvergence point (they skipped a branch or left a loop, and go "
                       f"on only after the wait), which the executor (a {unit}'s threads in "
                       f"lockstep) cannot run: {lines}")
            return DivergentWait(message, whole) if whole else EmulationUnsupported(message)
        return EmulationError(f"deadlock: every thread of the block waits for "
                              f"something that can no longer happen ({lines})")


class _Aborted(BaseException):
    """Unwinds a warpgroup when the block has failed elsewhere."""
