"""Switches of pallas-core: debug checks and the interpreter's opt-in checks.

Each switch works like JAX's config states: ``pl.enable_debug_checks(True)`` sets it,
``with pl.enable_debug_checks(True): ...`` sets it for a block.
"""

from __future__ import annotations

import contextvars
from typing import Any


class _Switch:
    """A boolean setting usable as a setter and as a context manager."""

    def __init__(self, name: str, doc: str, default: bool = False):
        self.name = name
        self.__doc__ = doc
        self._var: contextvars.ContextVar[bool] = contextvars.ContextVar(name, default=default)
        self._global = default

    @property
    def value(self) -> bool:
        return self._var.get(self._global)

    def __call__(self, new_val: Any = True) -> _SwitchContext:
        return _SwitchContext(self, bool(new_val))

    def __repr__(self) -> str:
        return f"<pallas switch {self.name}={self.value}>"


class _SwitchContext:
    def __init__(self, switch: _Switch, value: bool):
        self._switch = switch
        self._old_global = switch._global
        switch._global = value  # takes effect at once, like jax.config.update
        self._token = None
        self._value = value

    def __enter__(self):
        self._token = self._switch._var.set(self._value)
        return self

    def __exit__(self, *exc):
        self._switch._var.reset(self._token)
        self._switch._global = self._old_global
        return False


enable_debug_checks = _Switch(
    "pallas_enable_debug_checks", "Makes pl.debug_check fail the call when its condition is false."
)
enable_poison_buffers = _Switch(
    "pallas_poison_buffers",
    "Interpreter: report reads of uninitialised memory (outputs and scratch nobody wrote) "
    "with the operand, the grid iteration and the block.",
)
enable_bounds_checks = _Switch(
    "pallas_bounds_checks",
    "Interpreter: report block indices outside the array with the operand, the grid "
    "iteration and the block.",
)


def debug_checks_enabled() -> bool:
    return enable_debug_checks.value
