"""The executor's errors: a fault of the executed code, and a gap of the executor."""

from __future__ import annotations

from pallas._src.registry.backend import LevelUnsupportedError


class ExecutorError(RuntimeError):
    """The generated code cannot run to its end: a fault found by executing it (an
    out-of-bounds access, a wait that can never complete, a DMA never waited for)."""


class ExecutorUnsupported(ExecutorError, LevelUnsupportedError):
    """The executor does not implement something the module uses (an op, a type, an
    attribute): the conformance suite reports the case unsupported at ``emulate``."""


ExecutorError.__module__ = "pallas.executor"
ExecutorUnsupported.__module__ = "pallas.executor"
