"""The Mosaic GPU executor on the shared engine of :mod:`pallas.executor`, SIMT style:
its rule table (the upstream dialects' rules from the parent, this package's
``gpu``/``nvvm``/``llvm``/``memref``/``vector`` rules and SIMT ``scf``), its compiler
(the value model) and its :class:`Machine` (the execution model).

A value is a numpy array whose leading axis is the thread: length 1 when every thread
holds the same value (host code, constants), the block's thread count otherwise; numpy
broadcasting mixes the two.
"""

from __future__ import annotations

import re

import numpy as np

from pallas.executor import UPSTREAM, Compiler, OpRuleTable, int_array_attr, run
from pallas_mosaic_gpu._src.executor.memory import Memory
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported

#: op name -> rule(op, compiler) -> fn(machine, *operands) -> tuple | None; the upstream
#: dialects' rules come from the parent, pallas.executor.UPSTREAM.
OPS = OpRuleTable("mosaic_gpu executor", parent=UPSTREAM)
op = OPS.register

#: The inline PTX (``llvm.inline_asm``) the executor runs, recognised by pattern:
#: (regex over the stripped text, rule(op, match) -> fn(machine, *operands) -> the op's
#: results as a tuple, or None). ``ops_llvm``'s ``llvm.inline_asm`` rule reads it.
ASM_PATTERNS: list = []


def asm(pattern: str):
    """Registers the rule of the inline PTX that fully matches ``pattern``."""
    def deco(builder):
        ASM_PATTERNS.append((re.compile(pattern, re.S), builder))
        return builder

    return deco


def no_effect(o, cc):
    """The rule of an op with nothing for the executor to do (a fence, or a wait for work
    that completed when it was issued): its run takes any operands and returns none."""
    return _nothing


def _nothing(m, *operands) -> None:
    return None


def dimension_rules(values: dict) -> None:
    """Registers the ops that read one dimension of the launch (their ``dimension``
    attribute, x, y or z): ``values`` maps each op name to ``value(m, d) -> array`` (the
    op's one result, a value per thread or one for all, for dimension ``d``)."""
    for name, value in values.items():
        op(name)(_dimension_rule(value))


def same_index(v: int) -> np.ndarray:
    """An index every thread holds alike (a launch or cluster size, a cluster id)."""
    return np.asarray([v], np.int64)


def _dimension_rule(value):
    def rule(o, cc):
        d = "xyz".index(str(o.attributes["dimension"]).split()[-1].rstrip(">"))
        return lambda m: (value(m, d),)

    return rule


class Machine:
    """What a running kernel sees: memory, the current block and its threads, the
    active-lane mask of divergent code, mbarriers and TMA descriptors."""

    def __init__(self, memory: Memory, compiler: GpuCompiler):
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


class GpuCompiler(Compiler):
    """The compiler of Mosaic GPU modules: a value carries a leading thread axis (length
    1 when every thread holds the same value, as constants do)."""

    name = "the Mosaic GPU executor"
    terminators = Compiler.terminators | {"gpu.terminator", "llvm.return"}
    function_ops = Compiler.function_ops | {"llvm.func"}
    unsupported = EmulationUnsupported

    def constant(self, value: np.ndarray) -> np.ndarray:
        return value[None]


def attr(o, name: str):
    return o.attributes[name]


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


__all__ = ["ASM_PATTERNS", "OPS", "asm", "GpuCompiler", "Machine", "as_lanes", "attr", "int_array_attr", "op", "run",
           "uniform"]
