"""Backend interpret modes, and forcing one onto every kernel.

``interpret=True`` (or ``pl.InterpretParams``) runs the reference interpreter. A backend
may offer an interpret mode of its own (TPU's simulated cores and DMAs, Mosaic GPU's
threads and barriers): its params object, passed as ``interpret=...``, implements
:class:`InterpretMode`, and ``pallas_call`` hands the kernel to it; a backend's mesh
hands ``core_map`` to it through ``Mesh.discharge_core_map(interpret)``.

``forced_interpret_mode(params)`` makes every ``pallas_call``/``core_map``/``kernel``
called in its extent run with ``interpret=params`` (``plgpu.force_gpu_interpret_mode``
builds on it). The forced params live in a JAX configuration state that is part of the
jit key and of the trace context: a function traced under a forced mode (or before it)
is traced again outside it (or under it), inner ``jax.jit``s included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

from pallas._src import jax_compat as jc


class InterpretMode:
    """The base class of a backend's interpret-mode params (``interpret=...``).

    ``lower_pallas_call`` receives what ``Backend.lower`` receives (the mesh of
    ``pl.kernel`` is ``grid_mapping.mesh``, None for a plain ``pallas_call``) and returns
    the MLIR values of the call's results (``ctx.avals_out`` gives their types).
    ``supports_dynamic_grid``: whether the mode takes grids with run-time sizes (their
    values arrive first among ``in_nodes``); without it pallas-core refuses such calls.
    A params object that does not subclass this runs in the reference interpreter.
    """

    supports_dynamic_grid: ClassVar[bool] = False

    def lower_pallas_call(self, ctx: Any, *in_nodes: Any, jaxpr: Any, grid_mapping: Any,
                          compiler_params: Any, name: str) -> Sequence[Any]:
        """Lowers one ``pallas_call`` to this interpret mode."""
        raise NotImplementedError(
            f"{type(self).__qualname__} does not implement lower_pallas_call")


_forced = jc.config.string_or_object_state(
    name="pallas_forced_interpret_mode", default=None,
    help="Interpret params that every Pallas kernel called meanwhile runs with.",
    include_in_jit_key=True, include_in_trace_context=True)


def forced_interpret() -> Any:
    """The params of the innermost active :func:`forced_interpret_mode` (else None)."""
    return _forced.value


@contextlib.contextmanager
def forced_interpret_mode(params: Any):
    """Within the block, kernels run with ``interpret=params`` (None: as written)."""
    with _forced(params):
        yield


def set_forced_interpret(params: Any) -> None:
    """From now on kernels run with ``interpret=params``; None turns it off."""
    _forced.set_global(params)


def resolve_interpret(interpret: Any) -> Any:
    """``interpret`` as written, or the forced params when it is off."""
    if interpret:
        return interpret
    forced = forced_interpret()
    return forced if forced is not None else interpret
