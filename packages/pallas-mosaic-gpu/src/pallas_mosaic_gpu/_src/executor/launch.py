"""Runs a Mosaic GPU module: its host function (TMA descriptors, the launch) and, at
``gpu.launch``, each CUDA block's threads, over operands placed in the flat memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jaxlib.mlir import ir

from pallas.executor import Plan, run
from pallas_mosaic_gpu._src.executor import (  # noqa: F401 - each module registers ops
    ops_async,
    ops_cf,
    ops_cluster,
    ops_cta_pair,
    ops_gpu,
    ops_llvm,
    ops_math,
    ops_memref,
    ops_prmt,
    ops_scf,
    ops_semaphore,
    ops_tcgen05,
    ops_vector,
    ops_wgmma,
    subbyte,
)
from pallas_mosaic_gpu._src.executor.engine import OPS, GpuCompiler, Machine
from pallas_mosaic_gpu._src.executor.memory import Memory
from pallas_mosaic_gpu._src.executor.sched import DivergentWait
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported
from pallas_mosaic_gpu._src.lowering.aliases import module_of_fn


def module_of(kernel) -> ir.Module:
    """The MLIR module a built kernel hands to Mosaic GPU's custom call (the ``module``
    parameter of the ``mosaic_gpu_p`` equation its function binds)."""
    try:
        return module_of_fn(kernel.fn, kernel.arg_shapes)
    except RuntimeError:
        raise RuntimeError(f"kernel {kernel.name} binds no Mosaic GPU custom call") from None


class CompiledModule:
    """A module compiled to plans: its host function's, holding the launch's."""

    def __init__(self, module: ir.Module):
        self.compiler = GpuCompiler(module, OPS)
        # Warpgroups whose warps wait for each other: a strand per warp.
        self.split_warps: frozenset = frozenset()
        main = [f for f in module.body.operations if f.operation.name == "func.func"
                and "llvm.emit_c_interface" in f.operation.attributes]
        if len(main) != 1:
            raise EmulationUnsupported("a Mosaic GPU module without exactly one entry point")
        self.main: Plan = self.compiler.region(main[0].operation.regions[0])


def compile_module(module: ir.Module) -> CompiledModule:
    """Compiles every op of the module's entry point; raises
    :class:`EmulationUnsupported` naming the first op the executor does not know."""
    with module.context:
        return CompiledModule(module)


def execute(compiled: CompiledModule, operands: Sequence[np.ndarray],
            out_shapes: Sequence[tuple], aliases: Sequence[tuple] = ()) -> list[np.ndarray]:
    """Runs the kernel on ``operands``; returns its outputs (``(shape, dtype)`` each).
    Output ``o`` of each ``(i, o)`` in ``aliases`` is operand ``i``'s buffer, as XLA
    aliases them (``input_output_aliases``).

    Warpgroups run as strands of 128 threads in lockstep; one whose warps wait for each
    other (:class:`~.sched.DivergentWait`) makes the kernel run again from the start, on
    fresh memory, with a strand per warp for that warpgroup (remembered for the module).
    """
    while True:
        try:
            return _execute(compiled, operands, out_shapes, aliases, compiled.split_warps)
        except DivergentWait as e:
            if e.warpgroups <= compiled.split_warps:
                raise
            compiled.split_warps = compiled.split_warps | e.warpgroups


def _execute(compiled, operands, out_shapes, aliases, split_warps: frozenset):
    mem = Memory()
    m = Machine(mem, compiled.compiler)
    m.split_warps = split_warps
    ins = [mem.put(_in_memory(x), f"operand {i}") for i, x in enumerate(operands)]
    shared = {o: i for i, o in aliases}
    outs = [ins[shared[k]] if k in shared else
            mem.alloc(_nbytes(s, d), f"result {k}")
            for k, (s, d) in enumerate(out_shapes)]
    buffers = mem.put(np.asarray(ins + outs, np.int64), "buffer table")
    env = m.env = [None] * compiled.compiler.nslots
    with np.errstate(all="ignore"):
        run(compiled.main, m, env, [np.zeros(1, np.int64), np.asarray([buffers], np.int64)])
    return [_read_result(mem, p, tuple(s), d) for p, (s, d) in zip(outs, out_shapes)]


def _in_memory(x) -> np.ndarray:
    """An operand as the device holds it: 4-bit integers packed two a byte."""
    x = np.ascontiguousarray(x)
    return subbyte.pack(x.reshape(1, -1)).reshape(-1) if subbyte.is_int4(x.dtype) else x


def _nbytes(shape, dtype) -> int:
    n = int(np.prod(shape))
    return -(-n // 2) if subbyte.is_int4(dtype) else n * np.dtype(dtype).itemsize


def _read_result(mem: Memory, ptr: int, shape: tuple, dtype) -> np.ndarray:
    if subbyte.is_int4(dtype):
        data = mem.read(ptr, (1, _nbytes(shape, dtype)), np.uint8)
        return subbyte.unpack(data, dtype).reshape(-1)[:int(np.prod(shape))].reshape(shape)
    return mem.read(ptr, shape, dtype)


def with_semaphores(kernel, operands: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``operands`` followed by the kernel's global semaphore buffer, zeroed as at every
    launch (``pl.get_global``/``plgpu.SemaphoreType`` in a kernel's scratch): Mosaic GPU
    passes it as an in/out buffer between the inputs and the outputs."""
    operands = list(operands)
    if kernel.sem_words:
        operands.append(np.zeros((kernel.sem_words,), np.int32))
    return operands


def run_kernel(kernel, operands: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Runs a built kernel (``lowering.build``) on ``operands`` (its ``in_shapes``)."""
    compiled = compile_module(module_of(kernel))
    return execute(compiled, with_semaphores(kernel, operands),
                   [(s.shape, s.dtype) for s in kernel.out_shapes], kernel.aliases)


def emulate_kernel(jaxpr, grid_mapping, compiler_params, name: str, args: Sequence,
                   out_avals: Sequence) -> list:
    """The ``emulate`` level of one ``pallas_call``: builds the kernel as the lowering
    does (bool operands travel as int8) and executes its module on ``args``."""
    import jax.numpy as jnp

    from pallas_mosaic_gpu._src.lowering import build

    kernel = build(jaxpr, grid_mapping, compiler_params, name)
    compiled = compile_module(module_of(kernel))
    operands = [np.asarray(a).astype(s.dtype) for a, s in zip(args, kernel.in_shapes)]
    outs = execute(compiled, with_semaphores(kernel, operands),
                   [(s.shape, s.dtype) for s in kernel.out_shapes], kernel.aliases)
    return [jnp.asarray(o.astype(a.dtype) if o.dtype != a.dtype else o)
            for o, a in zip(outs, out_avals)]


def plan_kernel(jaxpr, grid_mapping, compiler_params, name: str, out_avals: Sequence,
                target: str | None = None):
    """An emulated device's plan of one ``pallas_call``: the kernel built for ``target``
    and its module prepared once; ``run(*args)`` executes it on numpy operands."""
    from pallas_mosaic_gpu._src.lowering import build

    kernel = build(jaxpr, grid_mapping, compiler_params, name, target=target)
    compiled = compile_module(module_of(kernel))
    out_shapes = [(s.shape, s.dtype) for s in kernel.out_shapes]

    def run(*args):
        operands = [np.asarray(a).astype(s.dtype) for a, s in zip(args, kernel.in_shapes)]
        outs = execute(compiled, with_semaphores(kernel, operands), out_shapes,
                       kernel.aliases)
        return [o.astype(a.dtype) if o.dtype != a.dtype else o
                for o, a in zip(outs, out_avals)]

    return run
