"""An executor for Mosaic TPU modules: runs the module a ``tpu_custom_call`` carries on
CPU with numpy, op by op with MLIR semantics, inside the TPU execution model (grid,
windows, memory spaces, scalar prefetch, scratch, semaphores, DMAs, aliasing).

Public entry points are re-exported by :mod:`pallas_tpu.executor`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pallas.executor import ExecutorError
from pallas_tpu._src.executor.engine import OPS
from pallas_tpu._src.executor.model import compile_module, execute
from pallas_tpu._src.executor.module import deserialize, payload_of


def run_custom_call(backend_config: bytes | str, operands: Sequence, out_shapes: Sequence,
                    input_output_aliases: Sequence[tuple[int, int]] = ()) -> list[np.ndarray]:
    """Runs the kernel of a ``tpu_custom_call``.

    ``backend_config``: the custom call's backend config (JSON with the base64 module);
    ``operands``: its operands (arrays); ``out_shapes``: ``(shape, dtype)`` per result;
    ``input_output_aliases``: ``(operand index, result index)`` pairs.
    """
    kernel = compile_module(payload_of(backend_config))
    shapes = [(tuple(s), np.dtype(d)) for s, d in out_shapes]
    return execute(kernel, [np.asarray(x) for x in operands], shapes,
                   tuple(input_output_aliases))


__all__ = ["OPS", "ExecutorError", "compile_module", "deserialize", "execute",
           "payload_of", "run_custom_call"]
