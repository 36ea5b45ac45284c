"""Cooperative threads: each simulated GPU thread is a generator that runs until it
must wait (a barrier phase, a semaphore), then yields a :class:`Blocker`.

The scheduler runs one thread at a time, round robin, and resumes a thread only when
what it waits for holds; if every unfinished thread waits, the kernel deadlocks and the
error says what each one waits for. One thread at a time makes runs deterministic;
races are still found, because the detector compares vector clocks, not the order the
simulation happened to pick.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any


class Blocker:
    """What a waiting thread waits for: ``ready()`` says whether it may resume."""

    def __init__(self, ready: Callable[[], bool], what: str):
        self.ready = ready
        self.what = what


class DeadlockError(RuntimeError):
    """Every unfinished thread of a kernel waits for something no thread will do."""


class SimThread:
    """One simulated thread: a name for messages and the generator running its body."""

    def __init__(self, name: str, body: Generator[Blocker, None, Any]):
        self.name = name
        self.body = body
        self.blocker: Blocker | None = None
        self.done = False


def run_threads(threads: Sequence[SimThread]) -> None:
    """Runs ``threads`` to completion (see the module docstring); re-raises the first
    error of a thread (closing the others), or :class:`DeadlockError`."""
    live = list(threads)
    try:
        while live:
            progressed = False
            for th in list(live):
                if th.blocker is not None and not th.blocker.ready():
                    continue
                progressed = True
                th.blocker = None
                try:
                    th.blocker = next(th.body)
                except StopIteration:
                    th.done = True
                    live.remove(th)
            if not progressed:
                waits = "\n".join(f"  {th.name} waits for {th.blocker.what}" for th in live)
                raise DeadlockError(
                    f"GPU interpret mode: the kernel deadlocked; {len(live)} thread(s) wait "
                    f"for something no thread will do:\n{waits}")
    finally:
        for th in live:
            th.body.close()
