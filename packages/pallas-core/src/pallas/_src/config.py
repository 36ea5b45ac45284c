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
        # JAX's own state of the same meaning (jax_pallas_poison_buffers, ...), which
        # upstream's switch is and upstream code sets: it turns this switch on too.
        self._jax_state = getattr(jc.config, f"jax_{name}", None)

    @property
    def value(self) -> bool:
        return bool(self._state.value) or bool(
            self._jax_state is not None and self._jax_state.value)

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


# ------------------------------------------------------------------------------------
# What reverse-mode differentiation does when it cannot emit the backward as kernels.

GRAD_FALLBACK_MODES = ("warn", "allow", "error")

_grad_fallback = jc.config.enum_state(
    name="pallas_grad_fallback",
    enum_values=GRAD_FALLBACK_MODES,
    default="warn",
    help="What jax.grad/vjp of a compiled pallas_call does when its backward pass cannot "
         "be emitted as kernels of the call's backend: 'warn' (default: run the XLA "
         "expansion and warn once per kernel), 'allow' (the same, silently) or 'error'. "
         "Also set by the environment variable PALLAS_GRAD_FALLBACK.",
    include_in_jit_key=True,
    include_in_trace_context=True,
)


class grad_fallback:  # noqa: N801 - used like a function, as the switches are
    """``pl.grad_fallback("error")``: sets how reverse mode treats a kernel whose backward
    pass cannot be emitted as kernels (``"warn"``, ``"allow"`` or ``"error"``); globally
    at once, and for a ``with`` block only when used as a context manager."""

    def __init__(self, mode: str):
        import jax

        if mode not in GRAD_FALLBACK_MODES:
            raise ValueError(f"grad_fallback mode must be one of {GRAD_FALLBACK_MODES}; "
                             f"got {mode!r}")
        self._old = _grad_fallback.get_global()
        jax.config.update("pallas_grad_fallback", mode)
        self._ctx = _grad_fallback(mode)

    def __enter__(self):
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        import jax

        self._ctx.__exit__(*exc)
        jax.config.update("pallas_grad_fallback", self._old)
        return False


def grad_fallback_mode() -> str:
    """The current mode of :class:`grad_fallback`."""
    return str(_grad_fallback.value)


# ------------------------------------------------------------------------------------
# What a pallas_call partitioned by jax.jit does with a sharded dimension it cannot split.

SHARDING_GATHER_MODES = ("warn", "allow", "error")

_sharding_gather = jc.config.enum_state(
    name="pallas_sharding_gather",
    enum_values=SHARDING_GATHER_MODES,
    default="warn",
    help="What a pallas_call under jax.jit does when an operand is sharded along a "
         "dimension that no independent grid axis tiles: 'warn' (default: gather it once "
         "and warn, naming the operand, the dimension and why), 'allow' (the same, "
         "silently) or 'error'. Also set by the environment variable "
         "PALLAS_SHARDING_GATHER.",
    include_in_jit_key=True,
    include_in_trace_context=True,
)


class sharding_gather:  # noqa: N801 - used like a function, as the switches are
    """``pl.sharding_gather("error")``: sets what a partitioned ``pallas_call`` does with
    a sharded dimension it cannot split (``"warn"``, ``"allow"`` or ``"error"``); globally
    at once, and for a ``with`` block only when used as a context manager."""

    def __init__(self, mode: str):
        import jax

        if mode not in SHARDING_GATHER_MODES:
            raise ValueError(f"sharding_gather mode must be one of {SHARDING_GATHER_MODES}; "
                             f"got {mode!r}")
        self._old = _sharding_gather.get_global()
        jax.config.update("pallas_sharding_gather", mode)
        self._ctx = _sharding_gather(mode)

    def __enter__(self):
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        import jax

        self._ctx.__exit__(*exc)
        jax.config.update("pallas_sharding_gather", self._old)
        return False


def sharding_gather_mode() -> str:
    """The current mode of :class:`sharding_gather`."""
    return str(_sharding_gather.value)
