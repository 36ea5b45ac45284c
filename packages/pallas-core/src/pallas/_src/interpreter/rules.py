"""The table of interpreter rules: how the reference interpreter runs each primitive.

A rule is ``rule(ctx, eqn, invals) -> list of outvals``. Ref operands arrive as
:class:`~pallas._src.interpreter.evaluator.Cell` objects holding the current value of
the buffer. Every primitive registers its rule next to its definition (core's here in
pallas-core, a backend's in the backend's module that defines the primitive, or through
the plugin hook ``pallas_interpret_rules``); a backend that must change a core rule (e.g.
pallas-tpu's multi-device ``semaphore_signal``) uses ``interpret_rules.override``.
"""

from __future__ import annotations

from collections.abc import Callable

from pallas._src.registry.rule_table import Rule, RuleTable

interpret_rules = RuleTable(
    "interpret_rules", "rule(ctx: KernelContext, eqn: JaxprEqn, invals: list) -> list")


def register_interpret_rule(prim, *, owner: str | None = None) -> Callable[[Rule], Rule]:
    """Decorator: registers ``rule`` as the interpreter rule of ``prim``."""
    return interpret_rules.register(prim, owner=owner)


# Schedules: a backend whose cores cooperate in ways the point-by-point grid loop cannot
# express (e.g. SparseCore subcores meeting at barriers) runs such kernels itself.
interpret_schedules: list[Callable] = []


def register_interpret_schedule(schedule: Callable) -> Callable:
    """Registers ``schedule(args, *, jaxpr, grid_mapping, checks, errors)``: it returns
    ``(outputs, error vector or None)`` for a kernel it runs itself, else None (the grid
    then runs point by point). ``errors`` is the checks' message table (None when no
    check is on). Registering the same function twice is a no-op."""
    if schedule not in interpret_schedules:
        interpret_schedules.append(schedule)
    return schedule
