"""Keeps the ROCm plugin's "No AMD GPUs were found" traceback out of users' output.

``jax-rocm7-plugin`` (``pallas-triton[rocm]``, installed to lower for AMD GPUs on any
machine) raises in its ``initialize()`` when the machine has no AMD GPU, and JAX logs
that as a "Jax plugin configuration error" with a traceback at its first backend use,
even under ``JAX_PLATFORMS=cpu``. Lowering for ``rocm`` does not need the plugin to be
initialised, so on a machine without an AMD GPU that record says nothing a user can act
on. This filter drops exactly that record (the rocm plugin's, with that error); every
other plugin error is still logged. ``PALLAS_TRITON_SHOW_ROCM_INIT=1`` turns it off.
"""

from __future__ import annotations

import logging
import os

_LOGGER = "jax._src.xla_bridge"


class NoAMDGPUFilter(logging.Filter):
    """Drops the ROCm plugin's initialisation error on machines without an AMD GPU."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or "No AMD GPUs were found" not in str(exc):
            return True
        return "rocm" not in " ".join(str(a) for a in (record.args or ()))


_FILTER = NoAMDGPUFilter()


def install() -> None:
    """Adds the filter to JAX's plugin-discovery logger (once; a no-op when
    ``PALLAS_TRITON_SHOW_ROCM_INIT`` is set)."""
    if os.environ.get("PALLAS_TRITON_SHOW_ROCM_INIT"):
        return
    logger = logging.getLogger(_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
