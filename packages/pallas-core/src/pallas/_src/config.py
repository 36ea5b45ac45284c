"""Switches of pallas-core: debug checks and the interpreter's opt-in checks.

Each switch is a JAX configuration state (so it takes part in ``jax.jit``'s cache key:
turning a check on re-traces functions compiled without it). Like upstream's, a switch
is a context manager, ``with pl.enable_debug_checks(True): ...``; beyond upstream,
calling it outside a ``with`` also sets it globally, and ``jax.config.update`` with the
state's name works too.
"""

from __future__ import annotations

from typing import Any

from pallas._src import jax_compat as jc


class _Switch:
    """A boolean JAX config state usable as a setter and as a context manager."""

    def __init__(self, name: str, doc: str):
        self.name = name
        self.__doc__ = doc
        self._state = jc.config.bool_state(
            name=name, default=False, help=doc, include_in_jit_key=True,
            include_in_trace_context=True,
        )

    @property
    def value(self) -> bool:
        return bool(self._state.value)

    def __call__(self, new_val: Any = True) -> _SwitchContext:
        return _SwitchContext(self, bool(new_val))

    def __repr__(self) -> str:
        return f"<pallas switch {self.name}={self.value}>"


class _SwitchContext:
    """Sets the switch globally at once; as a context, restores it on exit."""

    def __init__(self, switch: _Switch, value: bool):
        import jax

        self._switch = switch
        self._old_global = bool(switch._state.get_global())
        jax.config.update(switch.name, value)
        self._ctx = switch._state(value)

    def __enter__(self):
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        import jax

        self._ctx.__exit__(*exc)
        jax.config.update(self._switch.name, self._old_global)
        return False


enable_debug_checks = _Switch(
    "pallas_enable_debug_checks",
    "Makes pl.debug_check fail the call when its condition is false.",
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
