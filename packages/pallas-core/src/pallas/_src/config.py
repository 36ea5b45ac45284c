"""Settings of pallas-core: switches (debug checks, the interpreter's opt-in checks) and
modes (what reverse mode and partitioning do when they must fall back).

Each setting is a JAX configuration state (so it takes part in ``jax.jit``'s cache key:
turning a check on re-traces functions compiled without it). Like upstream's switches,
a setting is a context manager, ``with pl.enable_debug_checks(True): ...``; beyond
upstream, calling it outside a ``with`` also sets it globally, and ``jax.config.update``
with the state's name works too.
"""

from __future__ import annotations

from typing import Any

from pallas._src import jax_compat as jc


class _SettingContext:
    """Sets a setting globally at once; as a context, restores it on exit."""

    def __init__(self, state: Any, name: str, value: Any):
        import jax

        self._state = state
        self._name = name
        self._old_global = state.get_global()
        jax.config.update(name, value)
        self._ctx = state(value)

    def __enter__(self):
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        import jax

        self._ctx.__exit__(*exc)
        jax.config.update(self._name, self._old_global)
        return False


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

    def __call__(self, new_val: Any = True) -> _SettingContext:
        return _SettingContext(self._state, self.name, bool(new_val))

    def __repr__(self) -> str:
        return f"<pallas switch {self.name}={self.value}>"


class _Mode:
    """A JAX config state taking one of a few named modes (``"warn"``, ...), usable as a
    setter and as a context manager; the environment variable of the state's name in
    upper case (``PALLAS_GRAD_FALLBACK``) sets its default."""

    def __init__(self, public_name: str, modes: tuple[str, ...], default: str, *,
                 sets: str, help: str):
        self.name = f"pallas_{public_name}"
        self._public_name = public_name
        self.modes = modes
        listed = ", ".join(f'``"{m}"``' for m in modes[:-1]) + f' or ``"{modes[-1]}"``'
        self.__doc__ = (f'``pl.{public_name}("{modes[-1]}")``: sets {sets} ({listed}); '
                        "globally at once, and for a ``with`` block only when used as a "
                        "context manager.")
        self._state = jc.config.enum_state(
            name=self.name, enum_values=modes, default=default,
            help=f"{help} Also set by the environment variable {self.name.upper()}.",
            include_in_jit_key=True, include_in_trace_context=True,
        )

    @property
    def value(self) -> str:
        return str(self._state.value)

    def __call__(self, mode: str) -> _SettingContext:
        if mode not in self.modes:
            raise ValueError(f"{self._public_name} mode must be one of {self.modes}; "
                             f"got {mode!r}")
        return _SettingContext(self._state, self.name, mode)

    def __repr__(self) -> str:
        return f"<pallas mode {self.name}={self.value}>"


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
# What a pallas_call does where it must fall back: reverse-mode differentiation when it
# cannot emit the backward as kernels, a pallas_call partitioned by jax.jit with a
# sharded dimension it cannot split. Each setting's ``.value`` is the current mode.

FALLBACK_MODES = ("warn", "allow", "error")

grad_fallback = _Mode(
    "grad_fallback", FALLBACK_MODES, "warn",
    sets="how reverse mode treats a kernel whose backward pass cannot be emitted as "
         "kernels",
    help="What jax.grad/vjp of a compiled pallas_call does when its backward pass cannot "
         "be emitted as kernels of the call's backend: 'warn' (default: run the XLA "
         "expansion and warn once per kernel), 'allow' (the same, silently) or 'error'.",
)

sharding_gather = _Mode(
    "sharding_gather", FALLBACK_MODES, "warn",
    sets="what a partitioned ``pallas_call`` does with a sharded dimension it cannot split",
    help="What a pallas_call under jax.jit does when an operand is sharded along a "
         "dimension that no independent grid axis tiles: 'warn' (default: gather it once "
         "and warn, naming the operand, the dimension and why), 'allow' (the same, "
         "silently) or 'error'.",
)
