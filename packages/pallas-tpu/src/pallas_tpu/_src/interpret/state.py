"""The simulated TPU of one interpreted kernel call: buffers, semaphores, clocks, threads.

One :class:`Simulation` is shared by every device (under ``shard_map``, each device's
part of the call arrives through its own host callback) and every core of the call.
Cores are Python threads; they block on semaphores and barriers with one condition
variable, which also detects deadlocks (every live core waiting, none able to proceed)
and aborts all cores when one fails, so that an error never leaves others hanging.
"""

from __future__ import annotations

import collections
import random
import threading
from collections.abc import Callable

import numpy as np

from pallas.plugins import Access, Cell, DeviceGroups, RaceDetector, RaceReport, VectorClocks
from pallas_tpu._src.interpret import boxes as B


class SimulationAborted(RuntimeError):
    """Raised in a core whose simulation was aborted by another core's or device's error."""


class DeadlockError(RuntimeError):
    """Every core of the simulation waits and none can proceed."""


class Buffer(Cell):
    """A simulated buffer: numpy ``storage`` (possibly padded) of a ``shape`` array.

    A :class:`~pallas.plugins.Cell`, so interpreter rules of value-level TPU primitives
    can read ``value``; the simulation itself indexes ``storage`` in place.
    """

    def __init__(self, storage: np.ndarray, shape, name: str, memory_space, key,
                 uninit: str = "nan"):
        self.storage = storage
        self.shape = tuple(int(n) for n in shape)
        self.origin = name
        self.memory_space = memory_space
        self.key = key
        self.init = None
        self.block = None
        self.uninit = uninit
        self.race_log = None  # its race detector's access log, once it has one
        # True while ``storage`` is a read-only view of an input: copied at the first
        # write (:meth:`own`), so an input that is only read is never copied.
        self.borrowed = False

    @property
    def dtype(self):
        return self.storage.dtype

    @property
    def value(self):
        if self.storage.shape == self.shape:
            return self.storage
        return self.storage[tuple(slice(0, n) for n in self.shape)]

    @value.setter
    def value(self, new):
        self.own()[tuple(slice(0, n) for n in self.shape)] = np.asarray(new)

    def own(self) -> np.ndarray:
        """The storage, made a private writable copy first if it is borrowed (every
        write goes through this; callers hold the simulation's lock or own the buffer)."""
        if self.borrowed:
            self.storage = np.array(self.storage)
            self.borrowed = False
        return self.storage

    def __repr__(self) -> str:
        return f"Buffer({self.origin}: {self.dtype}{list(self.shape)})"


class Semaphore:
    """A semaphore array, with a count per core of its device (signals may target any
    core) and, for race detection, the vector clock each count was last signalled with.
    Pending ``on_wait`` DMAs queue on the (core, element) they will signal."""

    def __init__(self, name: str, shape, num_cores: int):
        self.name = name
        self.shape = tuple(shape)
        self.counts = np.zeros((num_cores, *self.shape), np.int64)
        self.flat_counts = self.counts.reshape(num_cores, -1)  # a view: [core, flat]
        self.clocks: dict = {}
        self.tasks: dict = collections.defaultdict(collections.deque)

    def flat(self, index) -> int:
        out = 0
        for i, n in zip(index, self.shape):
            if not 0 <= i < n:
                raise ValueError(f"index {tuple(index)} is out of bounds for semaphore "
                                 f"{self.name} of shape {self.shape}")
            out = out * n + int(i)
        return out


class Simulation:
    """Shared state of one kernel call on ``num_devices`` devices of ``num_cores`` cores."""

    def __init__(self, params, num_devices: int, num_cores: int, name: str):
        self.params = params
        self.name = name
        self.num_devices = int(num_devices)
        self.num_cores = int(num_cores)
        self.total_cores = self.num_devices * self.num_cores
        # ``lock`` is ``cond``'s lock: ``with sim.lock`` for mutual exclusion alone (a C
        # call, where the condition's ``with`` is two Python calls).
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        # With one core on one device nobody else can wait on ``cond``: no notifications.
        self.shared = self.total_cores > 1
        self.logging = params.logging_mode is not None
        self.random_dmas = params.dma_execution_mode == "random"
        self.failed: BaseException | None = None
        self.failed_where = ""
        self.buffers: dict = {}
        self.semaphores: dict = {}
        self.rng = random.Random(params.random_seed if params.random_seed is not None else 0)
        self.report = RaceReport()
        self.detect = bool(params.detect_races)
        if self.detect:
            self.clocks = VectorClocks(params.get_vector_clock_size(self.num_devices))
            self.detector = RaceDetector(self.report, on_race=_print_race)
        else:
            self.clocks = None
            self.detector = None
        self.dma_count = 0
        self.next_dma_entry: int | None = None
        self.active = self.total_cores
        self.waiting: dict = {}  # thread key -> predicate "can proceed"
        self.barriers: dict = {}
        self.arrived_devices = 0
        self.pending_random: dict = {}  # issuer's global core -> DMAs in flight
        self.mesh_axes: tuple = ()  # ((name, size), ...) of the devices' mesh

    # -- identities ---------------------------------------------------------------------
    def global_core(self, device: int, core: int) -> int:
        return int(device) * self.num_cores + int(core)

    def dma_thread(self) -> int:
        """The clock entry of a new DMA: the DMA entries in turn (from a seeded random
        start), so DMAs in flight together rarely share one."""
        size = self.clocks.size
        if size <= self.total_cores:
            return self.rng.randrange(size)
        if self.next_dma_entry is None:
            self.next_dma_entry = self.rng.randrange(size - self.total_cores)
        k = self.next_dma_entry
        self.next_dma_entry = (k + 1) % (size - self.total_cores)
        return self.total_cores + k

    # -- logging (InterpretParams.logging_mode) ------------------------------------------
    def notify_all(self) -> None:
        """Wakes the threads waiting on ``cond`` (the caller holds it); none can wait
        when the simulation has a single core."""
        if self.shared:
            self.cond.notify_all()

    def log(self, what: str, message) -> None:
        """Prints ``message()`` when ``what`` ("BARRIER", "SEMAPHORE", "SHARED_MEMORY") is
        in the params' logging mode (hot paths test ``self.logging`` first)."""
        mode = self.params.logging_mode
        if mode is not None and getattr(type(mode), what) in mode:
            print(f"[TPU interpret mode: {self.name}] {message()}", flush=True)

    # -- memory ---------------------------------------------------------------------------
    def buffer(self, key, make: Callable[[], Buffer]) -> Buffer:
        with self.cond:
            buf = self.buffers.get(key)
            if buf is None:
                buf = self.buffers[key] = make()
                self.log("SHARED_MEMORY", lambda: f"allocated {_buffer_name(buf)} "
                         f"{buf.dtype}{list(buf.shape)} (key {key})")
            return buf

    def semaphore(self, key, shape, name: str) -> Semaphore:
        with self.cond:
            sem = self.semaphores.get(key)
            if sem is None:
                sem = self.semaphores[key] = Semaphore(name, shape, self.num_cores)
            return sem

    # -- race detection ---------------------------------------------------------------
    def record(self, thread: int, clock, kind: str, buf: Buffer, box, site: str,
               who: str) -> None:
        access = Access.of(thread, clock, kind, B.region(box), site, who)
        log = buf.race_log
        if log is None:  # the buffer's log, found once (a dict lookup by key otherwise)
            log = buf.race_log = self.detector.log(buf.key, _buffer_name(buf))
        races = log.record(access)
        if races:
            self.detector.report.add(races)
            for r in races:
                _print_race(r)

    # -- blocking ---------------------------------------------------------------------------
    def check_failed(self) -> None:
        if self.failed is not None:
            raise SimulationAborted(
                f"TPU interpret mode: the kernel {self.name} was aborted because "
                f"{self.failed_where} failed: {type(self.failed).__name__}: {self.failed}"
            )

    def fail(self, exc: BaseException, where: str) -> None:
        with self.cond:
            if self.failed is None and not isinstance(exc, SimulationAborted):
                self.failed, self.failed_where = exc, where
            self.cond.notify_all()

    def block_until(self, me, can_proceed: Callable[[], bool], what: str,
                    is_core: bool = True) -> None:
        """Waits (holding ``self.cond``) until ``can_proceed()``; detects deadlocks (all
        live cores waiting, none able to proceed)."""
        while True:
            self.check_failed()
            if can_proceed():
                return
            if not is_core:  # a device at a barrier: not one of the cores that may deadlock
                self.cond.wait(timeout=1.0)
                continue
            self.waiting[me] = can_proceed
            try:
                if len(self.waiting) >= self.active and not any(
                        p() for p in self.waiting.values()):
                    err = DeadlockError(
                        f"TPU interpret mode: deadlock in {self.name}: every core waits "
                        f"and none can proceed ({me} waits for {what})"
                    )
                    self.fail(err, str(me))
                    raise err
                self.cond.wait(timeout=1.0)
            finally:
                self.waiting.pop(me, None)

    def thread_done(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def barrier(self, me, key, parties: int, on_release: Callable[[], None] | None = None):
        """A reusable barrier of ``parties`` threads named ``key``."""
        with self.cond:
            self.log("BARRIER", lambda: f"{me} arrives at barrier {key!r}")
            state = self.barriers.setdefault(key, [0, 0])  # [arrived, generation]
            gen = state[1]
            state[0] += 1
            if state[0] == parties:
                state[0] = 0
                state[1] += 1
                if on_release is not None:
                    on_release()
                self.cond.notify_all()
                return
            self.block_until(me, lambda: state[1] != gen, f"barrier {key}", is_core=False)


def _buffer_name(buf: Buffer) -> str:
    space = getattr(buf.memory_space, "name", buf.memory_space)
    return f"{buf.origin} ({space})"


def _print_race(race) -> None:
    print(f"RACE DETECTED: {race}", flush=True)


# -- the registry of running simulations (shared by the devices of one call) -----------

#: The running simulations; ``GROUPS.leave(sim)`` when a device is done with its own.
GROUPS = DeviceGroups()
_latest_report = [RaceReport()]


def latest_report() -> RaceReport:
    return _latest_report[0]


def join(config_key, device: int, make: Callable[[], Simulation]) -> Simulation:
    """The simulation of this device's next call of kernel ``config_key``."""
    def make_and_report():
        sim = make()
        _latest_report[0] = sim.report
        return sim

    return GROUPS.join(config_key, device, make_and_report)


def reset_all() -> None:
    """Forgets every simulation (after an error left one behind) and the race report."""
    GROUPS.reset(SimulationAborted("reset_tpu_interpret_mode_state()"))
    _latest_report[0] = RaceReport()
