"""The pallas-mosaic-gpu plugin: registered in the ``pallas.backends`` entry-point group.

Provides the ``mosaic_gpu`` backend for platform ``cuda``.
"""

from __future__ import annotations

from pallas.plugins import hookimpl
from pallas_mosaic_gpu._src.backend import MOSAIC_GPU


@hookimpl
def pallas_backends():
    return [MOSAIC_GPU]
