"""Happens-before race detection for interpreters that simulate concurrency.

Backend-neutral: a backend's interpret mode decides what its threads are (TPU cores,
DMA engines, GPU threads, TMA units) and when they synchronise (semaphores, barriers);
this module provides the vector clocks, a log of accesses per buffer, the
happens-before check and the race report.

Two accesses to one buffer *race* when their regions overlap, at least one writes, and
neither happens before the other: their vector clocks are unordered. Vector clocks
follow the classic rules: a thread ticks its own entry before each event it records;
a signal/release hands a copy of the signaller's clock to the synchronisation object;
a wait/acquire joins (elementwise max) that clock into the waiter's.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np

AccessKind = Literal["read", "write"]


# ------------------------------------------------------------------------------------
# Vector clocks.


def happens_before(a: np.ndarray, b: np.ndarray) -> bool:
    """True if the event with clock ``a`` happens before the event with clock ``b``."""
    return bool(np.all(a <= b) and np.any(a < b))


def concurrent(a: np.ndarray, b: np.ndarray) -> bool:
    """True if neither event happens before the other (nor are they the same event)."""
    return not happens_before(a, b) and not happens_before(b, a) and not np.array_equal(a, b)


class VectorClocks:
    """The clocks of ``size`` threads (thread ``t`` owns entry ``t``), thread-safe.

    ``tick`` before recording an event; ``release`` hands out the clock to attach to a
    signal; ``acquire`` joins a received clock in; ``barrier`` synchronises a group.
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a vector clock needs at least one entry, got size={size}")
        self.size = int(size)
        self._clocks = np.zeros((self.size, self.size), np.int64)
        self._lock = threading.Lock()

    def _check(self, thread: int) -> int:
        thread = int(thread)
        if not 0 <= thread < self.size:
            raise ValueError(
                f"thread {thread} is out of range for vector clocks of size {self.size}"
            )
        return thread

    def get(self, thread: int) -> np.ndarray:
        """A copy of ``thread``'s clock."""
        with self._lock:
            return self._clocks[self._check(thread)].copy()

    def tick(self, thread: int) -> np.ndarray:
        """Advances ``thread``'s own entry; returns a copy of its new clock."""
        t = thread if type(thread) is int and 0 <= thread < self.size else self._check(
            thread)
        with self._lock:
            self._clocks[t, t] += 1
            return self._clocks[t].copy()

    def release(self, thread: int) -> np.ndarray:
        """The clock a signal by ``thread`` carries (ticks first, so later events differ)."""
        return self.tick(thread)

    def acquire(self, thread: int, clock: np.ndarray | None) -> None:
        """``thread`` has received ``clock`` (from a signal it waited on): joins it in."""
        if clock is None:
            return
        t = self._check(thread)
        with self._lock:
            np.maximum(self._clocks[t], clock, out=self._clocks[t])

    def fork(self, parent: int, child: int) -> None:
        """``child`` starts now, after everything ``parent`` has done (e.g. a DMA issued)."""
        p, c = self._check(parent), self._check(child)
        with self._lock:
            self._clocks[p, p] += 1
            np.maximum(self._clocks[c], self._clocks[p], out=self._clocks[c])
            self._clocks[c, c] += 1

    def barrier(self, threads: Iterable[int]) -> None:
        """Every thread in ``threads`` has waited for every other one."""
        ts = [self._check(t) for t in threads]
        if not ts:
            return
        with self._lock:
            joined = self._clocks[ts].max(axis=0)
            for t in ts:
                self._clocks[t] = joined
                self._clocks[t, t] += 1


# ------------------------------------------------------------------------------------
# Regions: a box of index ranges, one (start, stop, step) per dimension.

Region = tuple[tuple[int, int, int], ...]


def region(*dims) -> Region:
    """A region from per-dimension ``slice``s, ``(start, stop[, step])`` tuples or ints."""
    out = []
    for d in dims:
        if isinstance(d, slice):
            out.append((int(d.start or 0), int(d.stop), int(d.step or 1)))
        elif isinstance(d, (tuple, list)):
            start, stop, *step = d
            out.append((int(start), int(stop), int(step[0]) if step else 1))
        else:
            out.append((int(d), int(d) + 1, 1))
    return tuple(out)


def _dims_overlap(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    (s1, e1, p1), (s2, e2, p2) = a, b
    lo, hi = max(s1, s2), min(e1, e2)
    if lo >= hi:
        return False
    if p1 == 1 and p2 == 1:
        return True
    # Strided: is there a point of both progressions in [lo, hi)? Walk the sparser one.
    if p1 < p2:
        (s1, p1), (s2, p2) = (s2, p2), (s1, p1)
    first = s1 + max(0, -(-(lo - s1) // p1)) * p1
    for x in range(first, hi, p1):
        if (x - s2) % p2 == 0:
            return True
        if x - first > 4096 * p1:  # give up exactness on huge ranges: assume overlap
            return True
    return False


def regions_overlap(a: Region, b: Region) -> bool:
    """True if the regions share an element (missing trailing dimensions cover all)."""
    return all(_dims_overlap(x, y) for x, y in zip(a, b))


def _covers(a: Region, b: Region) -> bool:
    """True if every element of ``b`` is in ``a`` (conservative: unit strides only)."""
    if len(a) != len(b):
        return False
    for (sa, ea, pa), (sb, eb, _) in zip(a, b):  # a loop: called per logged access
        if pa != 1 or sb < sa or eb > ea:
            return False
    return True


# ------------------------------------------------------------------------------------
# Accesses, races, logs.


@dataclasses.dataclass(frozen=True, eq=False)
class Access:
    """One read or write of ``region`` of a buffer by ``thread`` at vector time ``clock``.

    ``who`` describes the thread for people ("core 1 of device 0", "DMA from core 0");
    ``site`` is where in the kernel source the access comes from.
    """

    thread: int
    clock: np.ndarray
    kind: AccessKind
    region: Region
    site: str = "<unknown>"
    who: str = ""

    @classmethod
    def of(cls, thread: int, clock: np.ndarray, kind: AccessKind, region: Region,
           site: str = "<unknown>", who: str = "") -> Access:
        """``Access(...)`` for hot paths: the same object, built without the frozen
        dataclass's per-field ``object.__setattr__`` calls."""
        a = object.__new__(cls)
        a.__dict__.update(thread=thread, clock=clock, kind=kind, region=region, site=site,
                          who=who)
        return a

    def describe(self) -> str:
        who = self.who or f"thread {self.thread}"
        rng = ", ".join(f"{s}:{e}" + (f":{p}" if p != 1 else "") for s, e, p in self.region)
        return f"{self.kind} of [{rng}] by {who} at {self.site}"


@dataclasses.dataclass(frozen=True, eq=False)
class Race:
    """Two conflicting accesses to ``buffer``, neither of which happens before the other."""

    buffer: str
    first: Access
    second: Access

    def __str__(self) -> str:
        return (f"data race on {self.buffer}:\n  {self.first.describe()}\n"
                f"  {self.second.describe()}")


_SMALL_LOG = 8  # logs up to this long are compared in Python, longer ones with numpy
_le = operator.le
_guards: dict = {}
_I64 = np.dtype("<i8")
_and = np.logical_and.reduce  # ndarray.all goes through a Python wrapper first


def _all1(x):
    return _and(x, axis=1)


def _all0(x):
    return _and(x, axis=None)


def _packed(clock: np.ndarray) -> int:
    """``clock`` (non-negative entries below 2**63) as one Python integer, 64 bits per
    entry, so that :func:`_packed_le` compares whole clocks in a few integer operations."""
    if clock.dtype != _I64:
        clock = clock.astype(_I64)
    return int.from_bytes(clock.tobytes(), "little")


def _guard(size: int) -> int:
    """The top bit of each 64-bit field of a packed clock of ``size`` entries."""
    g = _guards.get(size)
    if g is None:
        g = _guards[size] = sum(1 << (64 * i + 63) for i in range(size))
    return g


def _packed_le(a: int, b: int, guard: int) -> bool:
    """Elementwise ``a <= b`` of two packed clocks: per field, ``(b + 2**63) - a`` keeps
    its top bit exactly when ``b >= a``, and never borrows from the next field."""
    return ((b | guard) - a) & guard == guard


class AccessLog:
    """The accesses of one buffer that may still race with future ones.

    Only the clocks decide: two accesses race unless one happens before the other (or
    they carry the same clock, i.e. are one event, e.g. a DMA's read and write). So a
    backend may map several logical threads (e.g. DMA engines) onto one clock entry.

    :meth:`record` checks a new access against the log, returns the races it forms, and
    appends it; accesses that the new one makes redundant (they happen before it and
    its region covers theirs, and every future conflict with them would also conflict
    with it) are dropped, which keeps the log short for kernels that synchronise.
    """

    def __init__(self, name: str):
        self.name = name
        self._entries: list[Access] = []
        self._clocks: np.ndarray | None = None  # the entries' clocks, one per row
        self._tuples: list[int] = []  # or, for a short log, as packed integers
        self._writes = 0  # how many logged accesses are writes
        self._packed_size = 0  # the clock size of the packed integers in ``_tuples``
        # Long logs: (clocks, regions, is-write, number of rows used, a clock at least
        # every logged one), with spare rows.
        self._arrays: tuple | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, access: Access) -> list[Race]:
        with self._lock:
            if len(self._entries) > _SMALL_LOG:
                found = self._record_many(access)
                if found is not None:
                    return found
            return self._record_few(access)

    def _record_few(self, access: Access) -> list[Race]:
        clock = np.asarray(access.clock)
        if len(self._entries) <= _SMALL_LOG:
            return self._record_short(access, clock)
        # A long log whose regions' ranks differ: every logged clock compared at once.
        races = []
        entries, clocks = self._entries, self._clocks
        if clocks is None or clocks.shape != (len(entries), clock.shape[0]):
            clocks = np.stack([np.asarray(e.clock) for e in entries])
        le = _all1(clocks <= clock)
        same = _all1(clocks == clock)
        before = (le & ~same).tolist()
        same = same.tolist()
        keep, kept = [], []
        writes, areg = access.kind == "write", access.region
        for k, prev in enumerate(entries):
            if before[k]:
                # Ordered: no race; dropped if the new access makes it redundant.
                redundant = (writes or prev.kind == "read") and _covers(areg, prev.region)
            else:
                redundant = False
                if (writes or prev.kind == "write") and not same[k] and regions_overlap(
                        prev.region, areg):
                    races.append(Race(self.name, prev, access))
            if not redundant:
                keep.append(prev)
                kept.append(k)
        rows = clocks if len(kept) == len(entries) else clocks[kept]
        self._store_few(keep, access, [], np.concatenate([rows, clock[None, :]]))
        return races

    def _record_short(self, access: Access, clock: np.ndarray) -> list[Race]:
        """:meth:`_record_few` for a log of at most ``_SMALL_LOG`` accesses, in one pass
        over clocks packed into integers (the same decisions)."""
        entries = self._entries
        cur = _packed(clock)
        guard = _guard(clock.shape[0])
        olds = self._tuples
        if len(olds) != len(entries) or self._packed_size != clock.shape[0]:
            olds = [_packed(np.asarray(e.clock)) for e in entries]
        races, keep, keep_olds = [], [], []
        writes, areg = access.kind == "write", access.region
        for prev, o in zip(entries, olds):
            if o != cur and _packed_le(o, cur, guard):
                # Ordered: no race; dropped if the new access makes it redundant.
                if (writes or prev.kind == "read") and _covers(areg, prev.region):
                    continue
            elif (o != cur and (writes or prev.kind == "write")
                    and regions_overlap(prev.region, areg)):
                races.append(Race(self.name, prev, access))
            keep.append(prev)
            keep_olds.append(o)
        keep_olds.append(cur)
        self._store_few(keep, access, keep_olds, None)
        self._packed_size = clock.shape[0]
        return races

    def _store_few(self, keep: list[Access], access: Access, tuples: list[int],
                   clocks: np.ndarray | None) -> None:
        """Makes the log the accesses ``keep`` then ``access``, with their clocks cached
        either packed (``tuples``) or stacked (``clocks``), as the short paths leave it."""
        keep.append(access)
        self._entries = keep
        self._writes = sum(e.kind == "write" for e in keep)
        self._arrays = None
        self._tuples = tuples
        self._clocks = clocks

    def _record_many(self, access: Access) -> list[Race] | None:
        """:meth:`record` for a long log, with clocks, regions and kinds in arrays (the
        same decisions as :meth:`_record_few`); None when the regions' ranks differ.
        The arrays keep spare rows, so an access is appended without copying them."""
        entries, n, areg = self._entries, len(self._entries), access.region
        clock = np.asarray(access.clock)
        arrays = self._arrays
        if arrays is None or arrays[3] != n or arrays[1].shape[1] != 2 * len(areg) or (
                arrays[0].shape[1] != clock.shape[0]):
            if any(len(e.region) != len(areg) for e in entries):
                return None
            cap = 2 * n + 8
            clocks = np.zeros((cap, clock.shape[0]), clock.dtype)
            clocks[:n] = np.stack([np.asarray(e.clock) for e in entries])
            # Per dimension (-start, stop), one row per access: "inside [s, e)" is one
            # comparison with (-s, e).
            regions = np.zeros((cap, 2 * len(areg)), np.int64)
            regions[:n] = np.array([[x for lo, hi, _ in e.region for x in (-lo, hi)]
                                    for e in entries], np.int64).reshape(n, 2 * len(areg))
            kinds = np.zeros(cap, bool)
            kinds[:n] = [e.kind == "write" for e in entries]
            bound = tuple(clocks[:n].max(axis=0).tolist())
            self._writes = int(kinds[:n].sum())
        else:
            clocks, regions, kinds, _, bound = arrays
        C, R, K = clocks[:n], regions[:n], kinds[:n]
        writes = access.kind == "write"
        a = np.array([x for lo, hi, _ in areg for x in (-lo, hi)], np.int64)
        unit = all(step == 1 for _, _, step in areg)
        if not writes and not self._writes:
            return self._read_among_reads(access, clock, a, unit, clocks, regions, kinds)
        if bound is None:  # left unknown by reads among reads: computed when needed
            bound = tuple(C.max(axis=0).tolist())
        cur = tuple(clock.tolist())
        covered = None
        if unit:  # _covers: unit strides, ranges inside
            covered = _all1(R <= a)
            if not writes:
                covered &= ~K  # a read makes only reads redundant
        races, redundant = [], None
        if bound != cur and all(map(_le, bound, cur)):
            # ``bound`` (at least every logged clock) happens before this access, so
            # every logged access does: no race, and the covered ones are redundant.
            redundant = covered
        elif writes or K.any() or (covered is not None and covered.any()):
            # (A read in a log of reads races with nothing: only redundancy matters.)
            le = _all1(C <= clock)
            same = _all1(C == clock)
            before = le & ~same
            if covered is not None:
                redundant = before & covered
            candidates = ~before & ~same if writes else ~before & ~same & K
            races = [Race(self.name, entries[k], access)
                     for k in np.flatnonzero(candidates)
                     if regions_overlap(entries[k].region, areg)]
        if redundant is not None and redundant.any():
            self._writes -= int(K[redundant].sum())
            entries, n = self._compact(entries, clocks, regions, kinds, n, ~redundant)
        self._append(entries, clocks, regions, kinds, n, access, clock, a, writes,
                     tuple(map(max, bound, cur)))
        return races

    def _read_among_reads(self, access: Access, clock, a, unit: bool, clocks, regions,
                          kinds) -> list[Race]:
        """:meth:`_record_many` for a read when the log holds only reads: it races with
        nothing; the logged reads that happen before it and that its region covers are
        redundant. (Only the covered rows' clocks are compared; the log's bound clock is
        left to be recomputed when a write needs it.)"""
        entries = self._entries
        n = len(entries)
        if unit:
            rows = _all1(regions[:n] <= a).nonzero()[0]
            if len(rows) == 1:  # e.g. the same element read again: drop one row in place
                k = int(rows[0])
                c = clocks[k]
                if _all0(c <= clock) and not _all0(c == clock):
                    clocks[k:n - 1], regions[k:n - 1] = clocks[k + 1:n], regions[k + 1:n]
                    kinds[k:n - 1] = kinds[k + 1:n]
                    n -= 1
                    if entries is self._entries:
                        del entries[k]
                    else:
                        entries = entries[:k] + entries[k + 1:]
            elif len(rows):
                c = clocks[rows]
                drop = _all1(c <= clock) & ~_all1(c == clock)
                if drop.any():
                    keep = np.ones(n, bool)
                    keep[rows[drop]] = False
                    entries, n = self._compact(entries, clocks, regions, kinds, n, keep)
        self._append(entries, clocks, regions, kinds, n, access, clock, a, False, None)
        return []

    @staticmethod
    def _compact(entries, clocks, regions, kinds, n, keep):
        """Keeps the rows ``keep`` (a mask over the ``n`` used rows) at the top."""
        kept = np.flatnonzero(keep)
        m = len(kept)
        clocks[:m], regions[:m], kinds[:m] = clocks[kept], regions[kept], kinds[kept]
        return [entries[k] for k in kept], m

    def _append(self, entries, clocks, regions, kinds, n, access, clock, a, writes, bound):
        if n == clocks.shape[0]:  # full: twice the rows
            clocks = np.concatenate([clocks, np.zeros_like(clocks)])
            regions = np.concatenate([regions, np.zeros_like(regions)])
            kinds = np.concatenate([kinds, np.zeros_like(kinds)])
        clocks[n], regions[n], kinds[n] = clock, a, writes
        if entries is self._entries:
            entries.append(access)
        else:
            self._entries = [*entries, access]
        self._writes += writes
        self._tuples = []
        self._clocks = None
        self._arrays = (clocks, regions, kinds, n + 1, bound)


class RaceReport:
    """The races found so far (thread-safe); ``races_found`` as upstream's report."""

    def __init__(self):
        self._races: list[Race] = []
        self._lock = threading.Lock()

    @property
    def races(self) -> list[Race]:
        with self._lock:
            return list(self._races)

    @property
    def races_found(self) -> bool:
        with self._lock:
            return bool(self._races)

    def add(self, races: Sequence[Race]) -> None:
        if races:
            with self._lock:
                self._races.extend(races)

    def reset(self) -> None:
        with self._lock:
            self._races.clear()

    def __len__(self) -> int:
        return len(self.races)

    def __str__(self) -> str:
        races = self.races
        if not races:
            return "no data races found"
        return f"{len(races)} data race(s) found:\n" + "\n".join(str(r) for r in races)


class RaceDetector:
    """Access logs for many buffers, feeding one :class:`RaceReport`.

    ``buffer`` keys are any hashables (e.g. ``(device, "VMEM", id)``); ``name`` gives the
    buffer's human-readable name the first time it is seen. ``on_race`` (e.g. ``print``)
    is called with each race as it is found.
    """

    def __init__(self, report: RaceReport | None = None, on_race=None):
        self.report = report if report is not None else RaceReport()
        self.on_race = on_race
        self._logs: dict = {}
        self._lock = threading.Lock()

    def log(self, buffer, name: str | None = None) -> AccessLog:
        with self._lock:
            log = self._logs.get(buffer)
            if log is None:
                log = self._logs[buffer] = AccessLog(name or str(buffer))
            return log

    def record(self, buffer, access: Access, name: str | None = None) -> list[Race]:
        races = self.log(buffer, name).record(access)
        self.report.add(races)
        if self.on_race is not None:
            for r in races:
                self.on_race(r)
        return races

    def forget(self, buffer) -> None:
        """Drops ``buffer``'s log (it was deallocated; a new buffer may reuse the key)."""
        with self._lock:
            self._logs.pop(buffer, None)
