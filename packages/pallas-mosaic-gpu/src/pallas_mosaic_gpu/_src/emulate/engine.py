"""Compiles the ops of a region into a plan of Python closures and runs it, SIMT style.

Each op becomes ``(fn, operand slots, result slots)`` with ``fn(machine, *operands)``
returning a tuple of results (or None). A value is a numpy array whose leading axis is
the thread: length 1 when every thread holds the same value (host code, constants), the
block's thread count otherwise; numpy broadcasting mixes the two. Compiling once per
module keeps the MLIR bindings out of the per-block loop.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.emulate.memory import Memory
from pallas_mosaic_gpu._src.emulate.types import EmulationUnsupported

# op name -> builder(op, compiler) -> fn(machine, *operands) -> tuple | None
OPS: dict[str, Callable] = {}
TERMINATORS = ("scf.yield", "scf.condition", "func.return", "gpu.terminator",
               "llvm.return")


def op(*names: str):
    """Registers the builder of the ops ``names``."""

    def deco(builder):
        for n in names:
            OPS[n] = builder
        return builder

    return deco


class Machine:
    """What a running kernel sees: memory, the current block and its threads, the
    active-lane mask of divergent code, mbarriers and TMA descriptors."""

    def __init__(self, memory: Memory, compiler: Compiler):
        self.memory = memory
        self.compiler = compiler
        self.threads = 1  # 1 on the host; the block's thread count inside gpu.launch
        self.thread_id = (np.zeros(1, np.int64),) * 3
        self.block_id = (np.zeros(1, np.int64),) * 3
        self.block_dim = (1, 1, 1)
        self.grid_dim = (1, 1, 1)
        self.mask = None  # None: every lane active; else bool (threads,)
        self.mbarriers: dict[int, dict] = {}
        self.tma_descriptors: list[dict] = []
        self.cache: dict = {}
        self.env: list = []  # every SSA value's slot (slots are unique per value)
        self.block = None  # the block's warpgroup scheduler (sched.Block) in gpu.launch
        self.group = 0  # this machine's warpgroup in the block
        self.smem = self.smem_size = 0
        self.pending: dict = {}  # per-cluster state of async units (bulk groups, TMEM)
        self.cluster = None  # the cluster of the current block (ops_cluster.Cluster)
        self.cta_rank = 0  # the block's rank in its cluster
        self.split_warps: frozenset = frozenset()  # warpgroups run a strand per warp
        self.warpgroup = 0  # this strand's warpgroup in the block (sched.py)
        self.is_warp = False  # this strand is one warp of it

    def fork(self, thread_ids: np.ndarray) -> Machine:
        """A machine for some threads of the current block (a warpgroup): its own
        values and lane mask, the block's memory, SMEM, barriers and descriptors."""
        f = Machine.__new__(Machine)
        f.__dict__.update(self.__dict__)
        t = np.asarray(thread_ids, np.int64)
        bx, by, _ = self.block_dim
        f.threads = len(t)
        f.thread_id = (t % bx, t // bx % by, t // (bx * by))
        f.mask = None
        f.env = list(self.env)  # values defined outside the launch stay visible
        return f

    def active(self, pred=None) -> np.ndarray | None:
        """The lanes that execute a side effect: active and (if given) predicated."""
        m = self.mask
        if pred is not None:
            pred = np.broadcast_to(np.asarray(pred, bool).reshape(-1), (self.threads,))
            m = pred if m is None else (m & pred)
        return m

    def lanes(self, pred=None) -> np.ndarray:
        """The indices of the lanes that execute a side effect."""
        m = self.active(pred)
        return np.arange(self.threads) if m is None else np.nonzero(m)[0]


class Plan:
    """The compiled body of one block: its argument slots and steps."""

    __slots__ = ("args", "steps", "term")

    def __init__(self, args, steps, term):
        self.args, self.steps, self.term = args, steps, term


class Compiler:
    """Assigns slots to values and compiles blocks; knows the module's functions."""

    def __init__(self, module: ir.Module):
        self.slots: dict = {}
        self.nslots = 0
        self.funcs = {}
        for f in module.body.operations:
            if f.operation.name in ("func.func", "llvm.func"):
                self.funcs[ir.StringAttr(f.operation.attributes["sym_name"]).value] = f

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
            if name in TERMINATORS:
                term = tuple(self.slot(v) for v in o.operands)
                continue
            builder = OPS.get(name)
            if builder is None:
                raise EmulationUnsupported(
                    f"the Mosaic GPU executor does not implement op '{name}' "
                    f"(in: {str(o).splitlines()[0][:300]})")
            fn = builder(o.operation, self)
            steps.append((fn, tuple(self.slot(v) for v in o.operands),
                          tuple(self.slot(r) for r in o.results), name))
        return Plan(tuple(self.slot(a) for a in block.arguments), steps, term)

    def region(self, region) -> Plan:
        if len(region.blocks) != 1:
            raise EmulationUnsupported(
                f"the Mosaic GPU executor runs single-block regions; this one has "
                f"{len(region.blocks)} blocks")
        return self.block(region.blocks[0])


def run(plan: Plan, m: Machine, env: list, args=()) -> list:
    """Runs ``plan`` with its block arguments bound to ``args``; returns the terminator's
    operand values."""
    for s, a in zip(plan.args, args):
        env[s] = a
    for fn, ins, outs, _ in plan.steps:
        r = fn(m, *[env[i] for i in ins])
        if outs:
            for s, v in zip(outs, r):
                env[s] = v
    return [env[s] for s in plan.term]


def attr(o, name: str):
    return o.attributes[name]


def int_array_attr(a) -> list[int]:
    """The ints of a ``DenseI64ArrayAttr``/``DenseI32ArrayAttr``/``ArrayAttr``."""
    try:
        return [int(x) for x in a]
    except TypeError:
        return [int(ir.IntegerAttr(x).value) for x in ir.ArrayAttr(a)]


def as_lanes(x, n: int) -> np.ndarray:
    """``x`` with its thread axis broadcast to ``n`` lanes."""
    x = np.asarray(x)
    return np.broadcast_to(x, (n,) + x.shape[1:])


def uniform(x, m: Machine, what: str):
    """The single value every active lane holds in ``x`` (a scalar per lane)."""
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)[:, 0]
    if x.shape[0] > 1 and m.mask is not None:
        x = x[m.mask]
    if x.size == 0:
        return None
    if x.shape[0] > 1 and not (x == x[0]).all():
        raise EmulationUnsupported(
            f"the Mosaic GPU executor needs {what} to be the same in every thread")
    return x[0].item()
