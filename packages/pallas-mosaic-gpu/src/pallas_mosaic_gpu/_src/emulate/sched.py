"""The warpgroups of one CUDA block, each its own SIMT machine, run as coroutines.

On a GPU the warpgroups of a block make progress independently and meet only at
synchronisation: mbarrier waits, named barriers (``bar.sync``), ``__syncthreads``. The
executor runs each warpgroup (128 threads in lockstep) until it must wait for something
another warpgroup (or a copy) has not done yet, then switches to the next warpgroup
that can go on, round robin; so a warp-specialised kernel (a producer warpgroup issuing
TMA copies, a consumer waiting on their barriers and releasing the slots) runs as it
does on the hardware. Exactly one warpgroup runs at a time (a baton passed between
Python threads), so runs are deterministic. When every unfinished warpgroup waits for
something no one can do any more, the wait is a deadlock (:class:`EmulationError`),
or, when the waiting warpgroup's own threads diverge (a lockstep executor cannot let
one branch wait for the other), :class:`EmulationUnsupported`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from pallas_mosaic_gpu._src.emulate.types import EmulationError, EmulationUnsupported

WARPGROUP = 128


class _Group:
    __slots__ = ("index", "machine", "blocked", "done", "error", "abort", "thread")

    def __init__(self, index, machine):
        self.index, self.machine = index, machine
        self.blocked = None  # (condition, description) while waiting
        self.done = False
        self.error = None
        self.abort = None
        self.thread = None


class Block:
    """Runs ``fn(machine)`` for every warpgroup machine of a block, switching between
    them where they wait."""

    def __init__(self, machines):
        self.groups = [_Group(i, m) for i, m in enumerate(machines)]
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
        lines = "; ".join(f"warpgroup {g.index} waits: {what()}" for g, what in waiting)
        divergent = [g.index for g, _ in waiting if g.machine.mask is not None
                     and not g.machine.mask.all()]
        if divergent:
            return EmulationUnsupported(
                f"warpgroup {divergent[0]} waits in code where its threads diverge, which "
                f"the executor (a warpgroup's threads in lockstep) cannot run: {lines}")
        return EmulationError(f"deadlock: every warpgroup of the block waits for "
                              f"something that can no longer happen ({lines})")


class _Aborted(BaseException):
    """Unwinds a warpgroup when the block has failed elsewhere."""
