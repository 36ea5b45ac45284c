"""The engine: compiles the ops of a region into a plan of Python closures and runs it.

An op becomes a step ``(fn, operand slots, result slots, op name)``; SSA values live in
a flat list (``env``) indexed by slot. A *rule* is a builder
``rule(op, compiler) -> fn`` registered in an :class:`OpRuleTable` under the op's name;
``fn(machine, *operand values)`` returns a tuple of result values (or ``None``).
``machine`` is the backend's execution state (the TPU grid and its DMAs, the GPU block's
threads and barriers): the engine only passes it along. Compiling once per module keeps
the MLIR bindings out of the hot loop.

The value model is the backend's: :class:`Compiler` has the hooks a shared rule needs
(:meth:`Compiler.constant` lifts a constant into a value, e.g. adding a thread axis).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jaxlib.mlir import ir

from pallas._src.executor.errors import ExecutorError, ExecutorUnsupported
from pallas._src.executor.types import dtype_of
from pallas._src.registry.rule_table import RuleTable, _owner_of


class OpRuleTable(RuleTable):
    """A :class:`~pallas.plugins.RuleTable` keyed by MLIR op name (``"arith.addi"``):
    rules are builders ``rule(op, compiler) -> fn(machine, *operands)``. A backend's
    table takes :data:`UPSTREAM` as its ``parent`` and registers its own dialect's ops
    (and any upstream op whose meaning its execution model changes)."""

    def __init__(self, name: str, *, parent: RuleTable | None = None):
        super().__init__(name, "rule(op, compiler) -> fn(machine, *operands) -> tuple | None",
                         parent=parent)

    def _check_primitive(self, p: Any) -> None:
        if not isinstance(p, str) or "." not in p:
            raise TypeError(f"{self.name}: executor rules are keyed by op names "
                            f"('dialect.op'), not {p!r}")


#: The rules of the upstream dialects (``func``, ``arith``, ``math``, ``scf``).
UPSTREAM = OpRuleTable("upstream MLIR executor rules")


class Plan:
    """The compiled body of one block: its argument slots, steps and the slots of its
    terminator's operands."""

    __slots__ = ("args", "steps", "term")

    def __init__(self, args, steps, term):
        self.args, self.steps, self.term = args, steps, term


class Compiler:
    """Assigns slots to values and compiles blocks with the rules of ``rules``; knows the
    module's functions. A backend subclasses it to name itself in errors, to add its
    dialect's terminators and function ops, and to give its value model."""

    #: Who is executing, in errors ("the Mosaic TPU executor").
    name = "the executor"
    #: Ops that end a block; their operands are the block's results.
    terminators: frozenset[str] = frozenset({"scf.yield", "scf.condition", "func.return"})
    #: Ops that define a function callable by ``func.call`` (by ``sym_name``).
    function_ops: frozenset[str] = frozenset({"func.func"})
    #: The error an unknown op raises.
    unsupported: type[Exception] = ExecutorUnsupported

    def __init__(self, module: ir.Module, rules: OpRuleTable, first_slot: int = 0):
        self.rules = rules
        self.slots: dict = {}
        self.nslots = first_slot
        self.funcs: dict[str, Any] = {}
        for f in module.body.operations:
            if f.operation.name in self.function_ops:
                self.funcs[ir.StringAttr(f.operation.attributes["sym_name"]).value] = f

    # -- the value model ------------------------------------------------------------
    def constant(self, value: np.ndarray) -> Any:
        """The value of a constant whose array is ``value`` (read-only by default)."""
        value.setflags(write=False)
        return value

    # -- compiling ------------------------------------------------------------------
    def slot(self, v) -> int:
        """The slot of the SSA value ``v`` (assigned on first sight)."""
        s = self.slots.get(v)
        if s is None:
            s = self.slots[v] = self.nslots
            self.nslots += 1
        return s

    def block(self, block) -> Plan:
        """Compiles ``block``; its terminator's operands become ``plan.term`` slots."""
        steps, term = [], ()
        for o in block.operations:
            name = o.operation.name
            if name in self.terminators:
                term = tuple(self.slot(v) for v in o.operands)
                continue
            rule = self.rules.get(name)
            if rule is None:
                raise self.unsupported(
                    f"{self.name} does not implement op '{name}' "
                    f"(in: {str(o).splitlines()[0][:300]})")
            fn = rule(o.operation, self)
            steps.append((fn, tuple(self.slot(v) for v in o.operands),
                          tuple(self.slot(r) for r in o.results), name))
        return Plan(tuple(self.slot(a) for a in block.arguments), steps, term)

    def region(self, region) -> Plan:
        """Compiles the one block of ``region``."""
        if len(region.blocks) != 1:
            raise self.unsupported(f"{self.name} runs single-block regions; this one has "
                                   f"{len(region.blocks)} blocks")
        return self.block(region.blocks[0])


def run(plan: Plan, m: Any, env: list, args: Sequence = ()) -> list:
    """Runs ``plan`` on the machine ``m`` with its block arguments bound to ``args``;
    returns the terminator's operand values. An error raised by an op gets a note naming
    the op (the innermost one)."""
    for s, a in zip(plan.args, args):
        env[s] = a
    name = None
    try:
        for fn, ins, outs, name in plan.steps:  # noqa: B007 - the failing op, on error
            r = fn(m, *[env[i] for i in ins])
            if outs:
                for s, v in zip(outs, r):
                    env[s] = v
    except Exception as e:
        if not any(n.startswith("executing op ") for n in getattr(e, "__notes__", ())):
            e.add_note(f"executing op {name}")
        raise
    return [env[s] for s in plan.term]


def cast(x, dt: np.dtype) -> np.ndarray:
    """``x`` as an array of ``dt`` (not copied when it already is one)."""
    x = np.asarray(x)
    return x if x.dtype == dt else x.astype(dt)


def elementwise(table: OpRuleTable, *names: str, owner: str | None = None
                ) -> Callable[[Callable], Callable]:
    """Decorator: registers ``f(*operand values) -> values`` in ``table`` for ops whose
    result is computed from their operands alone; the result is cast to the op's result
    element type. ``owner`` names who provides it (default: ``pallas`` in
    :data:`UPSTREAM`, else the package defining ``f``)."""

    def deco(f):
        def rule(o, cc):
            dt = dtype_of(o.results[0].type)
            return lambda m, *xs: (cast(f(*xs), dt),)

        who = owner or ("pallas" if table is UPSTREAM else _owner_of(f))
        table.register(*names, owner=who)(rule)
        return f

    return deco


__all__ = ["UPSTREAM", "Compiler", "ExecutorError", "OpRuleTable", "Plan", "cast",
           "elementwise", "run"]
