"""The pallas-tpu plugin: registered in the ``pallas.backends`` entry-point group.

Provides the ``mosaic_tpu`` backend, the interpreter rules of the TPU primitives, and
two explicit overrides of pallas-core interpreter rules (remote ``semaphore_signal``,
``lax.axis_index`` of a ``shard_map`` axis). All are registered when ``pallas_tpu`` is
imported, so ``interpret=True`` works before plugin discovery.
"""

from __future__ import annotations

from pallas.plugins import hookimpl, register_interpret_rule
from pallas_tpu._src import core_compat
from pallas_tpu._src.backend import MOSAIC_TPU
from pallas_tpu._src.primitives import _define, dma, misc, mxu, remote

OWNER = "pallas_tpu"


@hookimpl
def pallas_backends():
    return [MOSAIC_TPU]


def interpret_rules() -> dict:
    """Interpreter rules of every TPU primitive."""
    return {**dma.INTERPRET_RULES, **misc.INTERPRET_RULES, **mxu.INTERPRET_RULES,
            **_define.INTERPRET_RULES}


@hookimpl
def pallas_interpret_rules():
    return interpret_rules()


def register_interpret_rules() -> None:
    """Registers the TPU primitives' rules and pallas-tpu's overrides of core rules
    (idempotent: registering again from pallas-tpu replaces its own entries)."""
    for prim, fn in interpret_rules().items():
        register_interpret_rule(prim, owner=OWNER)(fn)
    table = core_compat.interpret_rules
    # Multi-device cases handled here, the rest deferred to core's rule.
    table.override(core_compat.semaphore_signal_p, owner=OWNER)(
        lambda core_rule: _deferring(remote.remote_semaphore_signal, core_rule))
    table.override(core_compat.axis_index_p, owner=OWNER)(
        lambda core_rule: _deferring(remote.mesh_axis_index, core_rule))


def _deferring(handler, core_rule):
    """The rule ``handler(ctx, eqn, invals, core_rule)``: ``semaphore_signal(device_id=)``
    and ``lax.axis_index`` of a ``shard_map`` axis, deferring to core's rule otherwise."""

    def rule(ctx, eqn, invals):
        return handler(ctx, eqn, invals, core_rule)

    return rule


register_interpret_rules()
