"""Compiles a region of a Mosaic module into a plan of Python closures and runs it.

Each op becomes ``(fn, operand slots, result slots)``; SSA values live in a flat list
(``env``) indexed by slot, slot 0 holding the :class:`~.model.Machine` (DMA queue, ...).
Compiling once per module keeps the MLIR bindings out of the hot loop.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxlib.mlir import ir

from pallas_tpu._src.executor.types import ExecutorError

# op name -> builder(op, compiler) -> fn(env, *operands) -> tuple of results (or None).
OPS: dict[str, Callable] = {}


def op(*names: str):
    """Registers the builder of the ops ``names``."""

    def deco(builder):
        for n in names:
            OPS[n] = builder
        return builder

    return deco


def elementwise(*names: str):
    """Registers ``fn(*operand arrays) -> array`` for ops whose result is computed from
    their operands alone; the result is cast to the op's result dtype."""
    from pallas_tpu._src.executor.types import elem_and_shape

    def deco(f):
        def builder(o, cc):
            dt, _ = elem_and_shape(o.results[0].type)

            def run(env, *xs):
                return (cast(f(*xs), dt),)

            return run

        for n in names:
            OPS[n] = builder
        return f

    return deco


def cast(x, dt):
    import numpy as np

    x = np.asarray(x)
    return x if x.dtype == dt else x.astype(dt)


class Plan:
    """The compiled body of one block: its argument slots and steps."""

    __slots__ = ("args", "steps", "term")

    def __init__(self, args, steps, term):
        self.args, self.steps, self.term = args, steps, term


class Compiler:
    """Assigns slots to values and compiles blocks; knows the module's functions."""

    def __init__(self, module: ir.Module):
        self.slots: dict = {}
        self.nslots = 1  # slot 0: the machine
        self.funcs = {}
        for f in module.body.operations:
            if f.operation.name == "func.func":
                self.funcs[ir.StringAttr(f.attributes["sym_name"]).value] = f

    def slot(self, v) -> int:
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
            if name in ("scf.yield", "tpu.yield", "func.return", "scf.condition"):
                term = tuple(self.slot(v) for v in o.operands)
                continue
            builder = OPS.get(name)
            if builder is None:
                raise ExecutorError(
                    f"the Mosaic executor does not implement op '{name}' (in {o})"[:400])
            fn = builder(o, self)
            steps.append((fn, tuple(self.slot(v) for v in o.operands),
                          tuple(self.slot(r) for r in o.results)))
        return Plan(tuple(self.slot(a) for a in block.arguments), steps, term)

    def region(self, region) -> Plan:
        return self.block(region.blocks[0])


def run(plan: Plan, env: list, args=()) -> list:
    """Runs ``plan`` with its block arguments bound to ``args``; returns the terminator's
    operand values."""
    for s, a in zip(plan.args, args):
        env[s] = a
    for fn, ins, outs in plan.steps:
        r = fn(env, *[env[i] for i in ins])
        if outs:
            for s, v in zip(outs, r):
                env[s] = v
    return [env[s] for s in plan.term]
