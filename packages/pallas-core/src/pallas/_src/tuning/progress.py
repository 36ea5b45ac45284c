"""A progress bar on stderr for tuning searches that take longer than a couple of seconds."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

ENV_PROGRESS = "PALLAS_TUNING_PROGRESS"
DELAY_S = 2.0  # a search shorter than this shows nothing


class Progress:
    """Draws ``name [#####.....] 3/8 config`` once ``DELAY_S`` seconds have passed.

    Shown when stderr is a terminal, or when ``PALLAS_TUNING_PROGRESS=1`` (``0`` hides
    it always).
    """

    def __init__(self, name: str, total: int, *, stream=None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.total, self.done = name, total, 0
        self.stream = stream if stream is not None else sys.stderr
        self.clock, self.start, self.drawn = clock, clock(), False
        env = os.environ.get(ENV_PROGRESS, "")
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = env == "1" or (env != "0" and tty)

    def step(self, what: str = "") -> None:
        """One config is done (``what`` names the next or the one just finished)."""
        self.done += 1
        if self.enabled and self.clock() - self.start >= DELAY_S:
            width = 24
            filled = width * self.done // max(self.total, 1)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\rtuning {self.name} [{bar}] {self.done}/{self.total} "
                              f"{what[:40]:<40}")
            self.stream.flush()
            self.drawn = True

    def close(self) -> None:
        if self.drawn:
            elapsed = self.clock() - self.start
            self.stream.write(f"\rtuning {self.name}: {self.total} configs in "
                              f"{elapsed:.1f} s{' ' * 50}\n")
            self.stream.flush()
