"""The pallas-tpu plugin: registered in the ``pallas.backends`` entry-point group.

Provides the ``mosaic_tpu`` backend and the interpreter rules of the TPU primitives.
"""

from __future__ import annotations

from pallas.plugins import hookimpl, register_interpret_rule
from pallas_tpu._src import core_compat
from pallas_tpu._src.backend import MOSAIC_TPU
from pallas_tpu._src.primitives import _define, dma, misc, mxu, remote


@hookimpl
def pallas_backends():
    return [MOSAIC_TPU]


def interpret_rules() -> dict:
    """Interpreter rules of every TPU primitive (and remote ``semaphore_signal``)."""
    return {**dma.INTERPRET_RULES, **misc.INTERPRET_RULES, **mxu.INTERPRET_RULES,
            **_define.INTERPRET_RULES,
            **_extend(core_compat.semaphore_signal_p, remote.remote_semaphore_signal),
            **_extend(core_compat.axis_index_p, remote.mesh_axis_index)}


def _extend(prim, handler) -> dict:
    """Wraps pallas-core's interpreter rule of ``prim`` with ``handler(ctx, eqn, invals,
    core_rule)``, which handles the multi-device case and defers to core's otherwise.

    Used for ``semaphore_signal(device_id=...)`` and for ``lax.axis_index`` of a
    ``shard_map`` axis (core knows only the grid's axis names).
    """
    table = core_compat.interpret_rules
    core_rule = table.get(prim)
    if core_rule is None or getattr(core_rule, "_pallas_tpu_extended", False):
        return {prim: core_rule} if core_rule is not None else {}

    def rule(ctx, eqn, invals):
        return handler(ctx, eqn, invals, core_rule)

    rule._pallas_tpu_extended = True
    return {prim: rule}


@hookimpl
def pallas_interpret_rules():
    return interpret_rules()


def register_interpret_rules() -> None:
    """Registers the rules directly, so ``interpret=True`` works before plugin discovery.

    (pallas-core discovers plugins lazily when it selects a backend; with
    ``interpret=True`` it may never do so. Importing pallas_tpu is enough.)
    """
    for prim, fn in interpret_rules().items():
        register_interpret_rule(prim)(fn)
