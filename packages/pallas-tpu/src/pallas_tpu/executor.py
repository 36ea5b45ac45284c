"""Runs Mosaic TPU modules on CPU: :func:`run_custom_call` takes a ``tpu_custom_call``'s
backend config, operands and result shapes and returns the results, executing the module
op by op (``ExecutorError`` names any op it does not know). Used by the ``mosaic_tpu``
conformance emulate level; other Mosaic emitters (SparseCore) can call it too."""

from pallas_tpu._src.executor import (  # noqa: F401
    OPS,
    ExecutorError,
    compile_module,
    execute,
    payload_of,
    run_custom_call,
)

__all__ = ["OPS", "ExecutorError", "compile_module", "execute", "payload_of",
           "run_custom_call"]
