"""The pallas-tpu-sparsecore plugin: registered in the ``pallas.backends`` entry-point
group. Provides the ``mosaic_sparsecore`` backend and the SparseCore primitives'
interpreter rules."""

from __future__ import annotations

from pallas.plugins import hookimpl, register_interpret_rule, register_interpret_schedule
from pallas_tpu_sparsecore._src.backend import MOSAIC_SPARSECORE


@hookimpl
def pallas_backends():
    return [MOSAIC_SPARSECORE]


def interpret_rules() -> dict:
    """Interpreter rules of every SparseCore primitive."""
    from pallas_tpu_sparsecore._src.primitives import control, gather, memory, vector

    return {**gather.INTERPRET_RULES, **memory.INTERPRET_RULES, **vector.INTERPRET_RULES,
            **control.INTERPRET_RULES}


@hookimpl
def pallas_interpret_rules():
    return interpret_rules()


def register_interpret_rules() -> None:
    """Registers the rules (and the subcore schedule) directly, so ``interpret=True``
    works before plugin discovery."""
    from pallas_tpu_sparsecore._src.subcores import schedule

    for prim, fn in interpret_rules().items():
        register_interpret_rule(prim)(fn)
    register_interpret_schedule(schedule)  # subcores meeting at barriers
