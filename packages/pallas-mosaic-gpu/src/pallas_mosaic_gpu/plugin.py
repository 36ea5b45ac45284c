"""The pallas-mosaic-gpu plugin: registered in the ``pallas.backends`` entry-point group.

Provides the ``mosaic_gpu`` backend for platform ``cuda``, and the reference-interpreter
rules of the Mosaic GPU primitives (so ``interpret=True`` runs ``plgpu`` kernels).
"""

from __future__ import annotations

from pallas.plugins import hookimpl
from pallas_mosaic_gpu._src.backend import MOSAIC_GPU


@hookimpl
def pallas_backends():
    return [MOSAIC_GPU]


@hookimpl
def pallas_interpret_rules():
    from pallas_mosaic_gpu._src import layouts
    from pallas_mosaic_gpu._src.primitives import (
        barriers,
        cluster_store,
        copies,
        hints,
        mma,
        multimem,
        tmem,
    )

    rules = {}
    for module in (barriers, cluster_store, copies, hints, mma, multimem, tmem, layouts):
        rules.update(module.INTERPRET_RULES)
    return rules
