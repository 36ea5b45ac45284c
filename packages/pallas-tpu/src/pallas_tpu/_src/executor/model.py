"""The TPU execution model around a kernel: the grid, the block windows each operand sees
(from ``window_params`` and the ``transform_<k>`` functions), memory spaces, scalar
prefetch, scratch, semaphores, DMAs and input/output aliasing.

The grid runs in row-major order (the last dimension fastest) on one core, as Mosaic
runs it; ``parallel`` and ``arbitrary`` dimensions are both sequential there. A windowed
operand's block is copied into a fresh buffer (the VMEM/SMEM window) when its block index
changes, and a written output block is copied back when its index changes and at the end,
as Mosaic's pipeline does; parts of a block past the array's edge are padding that is
never written back. ``ANY``/``HBM`` operands are the arrays themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import ml_dtypes
import numpy as np
from jaxlib.mlir import ir

from pallas.executor import ExecutorError, Plan, elem_and_shape, run
from pallas_tpu._src.executor import ops_math, ops_tpu  # noqa: F401 - register rules
from pallas_tpu._src.executor.derived import DerivedRef, identity
from pallas_tpu._src.executor.engine import OPS, TpuCompiler
from pallas_tpu._src.executor.module import deserialize
from pallas_tpu._src.executor.ops_vector import i64s

MemRefType = ir.MemRefType


DYNAMIC = -(2**63)  # MLIR's dynamic size: an iteration bound given as an operand


class Machine:
    """Per-run state every op receives: DMAs in flight, the grid, the values."""

    def __init__(self, grid=(), nslots: int = 0):
        self.dmas: list = []
        self.grid = tuple(grid)  # the grid's sizes for this run (tpu.iteration_bound)
        self.env: list = [None] * nslots  # every SSA value's slot
        # The hardware PRNG (pallas_tpu._src.prng_model): [seeds, draws since the seed],
        # kept across grid steps as the core keeps it; None until tpu.prng_set_seed_32.
        self.prng: list | None = None

    def start_dma(self, data, dst, dst_sem, src_sem) -> None:
        if data.shape != dst.shape:
            raise ExecutorError(f"DMA of shape {data.shape} into a buffer of {dst.shape}")
        if src_sem is not None:
            src_sem[...] = src_sem + 1
        self.dmas.append((data, dst, dst_sem))

    def wait_dma(self, sem, dst) -> None:
        for k, (data, d, s) in enumerate(self.dmas):
            if _same(s, sem) and (dst is None or _same(d, dst)):
                d[...] = data
                del self.dmas[k]
                return
        size = dst.nbytes if dst is not None else None
        if sem.shape == () and int(sem) > 0 and (size is None or int(sem) >= size):
            # A DMA an earlier kernel started, and that completed at its end, signalled
            # this semaphore (passed from kernel to kernel as an operand) by its size in
            # bytes, as the hardware and the interpreters count.
            sem[...] = sem - (size if size is not None else sem)
            return
        raise ExecutorError("a DMA wait on a semaphore no DMA in flight signals: it would "
                            "block forever")

    def finish(self, operands) -> None:
        """At the kernel's end: a DMA still in flight whose semaphore and destination
        outlive the kernel (operands, e.g. a semaphore output and an ``ANY`` output)
        completes and signals its semaphore, for a later kernel to wait on; any other
        would be lost."""
        lost = []
        for data, dst, sem in self.dmas:
            if any(_within(sem, o) for o in operands) and any(
                    _within(dst, o) for o in operands):
                dst[...] = data
                sem[...] = sem + data.nbytes
            else:
                lost.append(dst)
        self.dmas = []
        if lost:
            raise ExecutorError(f"{len(lost)} DMA(s) started by the kernel were never "
                                f"waited for (into the kernel's scratch or with a scratch "
                                f"semaphore, so no later kernel can wait for them)")


def _within(view, base) -> bool:
    """Whether ``view`` (a numpy view, or a DerivedRef of one: a bitcast) lies in the
    memory of the array ``base``."""
    if isinstance(view, DerivedRef):
        view = view.root
    lo = base.__array_interface__["data"][0]
    at = view.__array_interface__["data"][0]
    return lo <= at < lo + max(base.nbytes, 1)


def _same(a, b) -> bool:
    """Whether two refs (numpy views or DerivedRefs) name the same memory."""
    return identity(a) == identity(b)


@dataclasses.dataclass
class Kernel:
    """A compiled module: ``@main``, its grid and the windows of its operands."""

    main: Plan
    nslots: int
    grid: tuple
    num_prefetch: int
    num_scratch: int
    arg_types: list  # (dtype, shape, memory space) of each @main argument
    # per block operand: (transform plan, bounds, element window), or None (passed
    # whole); None for them all when the module has no window params (no grid)
    windows: list | None
    core_type: str


@functools.lru_cache(maxsize=256)
def compile_module(payload: bytes) -> Kernel:
    """Compiles the deserialised module of ``payload`` (cached)."""
    ctx, module = deserialize(payload)
    with ctx:
        cc = TpuCompiler(module, OPS)
        if "main" not in cc.funcs:
            raise ExecutorError("the Mosaic module has no @main function")
        main = cc.funcs["main"]
        attrs = main.attributes
        grid = tuple(i64s(attrs["iteration_bounds"])) if "iteration_bounds" in attrs else ()
        npf = ir.IntegerAttr(attrs["scalar_prefetch"]).value if "scalar_prefetch" in attrs \
            else 0
        nscr = ir.IntegerAttr(attrs["scratch_operands"]).value if "scratch_operands" in attrs \
            else 0
        core = str(attrs["tpu.core_type"]) if "tpu.core_type" in attrs else "tc"
        arg_types = []
        for a in main.regions[0].blocks[0].arguments:
            dt, shape = elem_and_shape(a.type)
            space = str(MemRefType(a.type).memory_space) if isinstance(a.type, MemRefType) \
                else ""
            arg_types.append((dt, shape, space))
        windows = [] if "window_params" in attrs else None
        wps = list(ir.ArrayAttr(attrs["window_params"])) if "window_params" in attrs else []
        for wp in wps:
            wp = ir.DictAttr(wp)
            if "transform_indices" not in wp:
                windows.append(None)
                continue
            fname = ir.FlatSymbolRefAttr(wp["transform_indices"]).value
            plan = cc.region(cc.funcs[fname].regions[0])
            bounds = tuple(i64s(wp["window_bounds"]))
            elem = "window_kind" in wp and "element_window" in str(wp["window_kind"])
            windows.append((plan, bounds, elem))
        body = cc.region(main.regions[0])
    return Kernel(body, cc.nslots, grid, npf, nscr, arg_types, windows, core)


class _Window:
    """One windowed operand: its HBM array, its block buffer and current block offsets."""

    def __init__(self, hbm, bounds, shape, dtype, writes):
        self.hbm, self.bounds, self.shape = hbm, bounds, shape
        self.buf = np.zeros(shape, dtype)
        self.at = None
        self.writes = writes

    def _slices(self, at):
        src, dst = [], []
        for o, n, full in zip(at, self.bounds, self.hbm.shape):
            lo, hi = max(o, 0), min(o + n, full)
            src.append(slice(lo, max(hi, lo)))
            dst.append(slice(lo - o, lo - o + max(hi - lo, 0)))
        return tuple(src), tuple(dst)

    def move_to(self, at) -> None:
        if at == self.at:
            return
        self.flush()
        src, dst = self._slices(at)
        full = np.zeros(self.bounds, self.buf.dtype)
        full[dst] = self.hbm[src]
        self.buf = full.reshape(self.shape)
        self.at = at

    def flush(self) -> None:
        if self.writes and self.at is not None:
            src, dst = self._slices(self.at)
            self.hbm[src] = self.buf.reshape(self.bounds)[dst]


def _signless(a: np.ndarray) -> np.ndarray:
    """uint4 arrays as int4 (the module's i4, which numpy will not mix with uint4); the
    wider unsigned types convert to their signed peers on assignment, as they are."""
    return a.view(ml_dtypes.int4) if a.dtype == ml_dtypes.uint4 else a


def execute(kernel: Kernel, operands, out_shapes, aliases=()) -> list[np.ndarray]:
    """Runs ``kernel`` on numpy ``operands`` (scalar-prefetch operands first, then the
    inputs); returns the outputs. ``aliases``: (input index, output index) pairs, indices
    counting the scalar-prefetch operands as inputs, as the custom call does."""
    npf = kernel.num_prefetch
    # Dynamic iteration bounds (MLIR's dynamic size) come first among the operands.
    ndyn = sum(1 for n in kernel.grid if n == DYNAMIC)
    dyn = iter(int(np.asarray(x).reshape(())) for x in operands[:ndyn])
    grid = tuple(next(dyn) if n == DYNAMIC else n for n in kernel.grid)
    operands = operands[ndyn:]
    aliases = tuple((i - ndyn, o) for i, o in aliases)
    # Inputs are read in place (an HBM operand may be gigabytes); those the kernel may
    # write are copied: an input aliased to an output (the output buffer it becomes) and
    # a semaphore (waits decrement it).
    npf_types = kernel.arg_types[len(kernel.grid):]
    written = {i for i, _ in aliases} | {
        k for k, (_dt, _shape, space) in enumerate(npf_types[:len(operands)])
        if "semaphore" in space}
    hbm_in = [_signless(np.array(x) if k in written else np.asarray(x))
              for k, x in enumerate(operands)]
    outs = []
    alias = dict((o, i) for i, o in aliases)
    for k, (shape, dt) in enumerate(out_shapes):
        outs.append(hbm_in[alias[k]] if k in alias else _signless(np.zeros(shape, dt)))
    ng = len(kernel.grid)
    block_types = kernel.arg_types[ng + npf:]
    hbm = hbm_in[npf:] + outs
    nblocks = len(hbm)
    windows = [None] * nblocks if kernel.windows is None else kernel.windows
    if len(windows) != nblocks or len(block_types) != nblocks + kernel.num_scratch:
        raise ExecutorError(
            f"the module's @main takes {len(block_types) - kernel.num_scratch} block "
            f"operands and has {len(windows)} window params; the call passes "
            f"{len(hbm_in) - npf} inputs and {len(outs)} outputs")
    n_in = len(hbm_in) - npf
    wins = []
    for k, (w, (dt, shape, _space)) in enumerate(zip(windows, block_types)):
        if w is None:
            wins.append(None)
            continue
        wins.append(_Window(hbm[k], w[1], shape, dt, writes=k >= n_in))
    scratch = [np.zeros(shape, dt) for dt, shape, _ in block_types[nblocks:]]
    # Scalar-prefetch operands live in SMEM for the whole grid: kernels may write them
    # (upstream's paged attention keeps its buffer index and step there). The pipeline
    # works out a point's blocks before the previous point's body runs, so its index
    # maps see the values as they were when the previous point began (``seen``).
    prefetch = [np.array(x) for x in hbm_in[:npf]]
    seen = [p.copy() for p in prefetch]
    machine = Machine(grid, kernel.nslots)
    env = machine.env
    with np.errstate(all="ignore"):
        for ids in itertools.product(*[range(n) for n in grid]):
            pid = [np.int32(i) for i in ids]
            refs = []
            for k, w in enumerate(wins):
                if w is None:
                    refs.append(hbm[k])
                    continue
                plan, bounds, elem = windows[k]
                idx = [int(v) for v in run(plan, machine, env, pid + seen)]
                at = tuple(idx) if elem else tuple(i * b for i, b in zip(idx, bounds))
                w.move_to(at)
                refs.append(w.buf)
            seen = [p.copy() for p in prefetch]  # as this point begins
            run(kernel.main, machine, env, pid + prefetch + refs + scratch)
        for w in wins:
            if w is not None:
                w.flush()
    machine.finish(hbm)
    return [o.view(dt) if o.dtype != dt else o for o, (_, dt) in zip(outs, out_shapes)]
