"""The Mosaic TPU executor's rule table and compiler, on the shared engine of
:mod:`pallas.executor`: the upstream dialects' rules come from
:data:`pallas.executor.UPSTREAM`; this package registers the ``tpu`` dialect's ops, the
``vector``/``memref`` ops over its memory model (memrefs are writable numpy views,
vectors arrays), and XLA's transcendental functions (``ops_math``)."""

from __future__ import annotations

import numpy as np

from pallas.executor import UPSTREAM, Compiler, ExecutorError, OpRuleTable, register_element_type

# Semaphores (``!tpu.semaphore``, ``!tpu.dma_semaphore``) are int32 counters.
register_element_type(lambda s: "semaphore" in s, np.int32)

#: op name -> rule(op, compiler) -> fn(machine, *operands) -> tuple of results (or None).
OPS = OpRuleTable("mosaic_tpu executor", parent=UPSTREAM)
op = OPS.register


class TpuCompiler(Compiler):
    """The compiler of Mosaic TPU modules: values are numpy arrays and scalars as they
    are (no thread axis); an op it does not know is an :class:`ExecutorError`."""

    name = "the Mosaic executor"
    terminators = Compiler.terminators | {"tpu.yield"}
    unsupported = ExecutorError
