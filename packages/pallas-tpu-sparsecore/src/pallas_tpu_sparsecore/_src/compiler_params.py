"""``plsc.CompilerParams``: ``pltpu.CompilerParams`` plus the target chip.

SparseCore kernels take ``pltpu.CompilerParams`` as upstream; this subclass adds
``chip`` (``"v5p"``, ``"v6e"``, ``"7x"`` or a ``pltpu.ChipVersion``), the chip the kernel
is checked and lowered for when no TPU is attached. Passing one selects the
``mosaic_sparsecore`` backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pallas_tpu as pltpu
from pallas_tpu_sparsecore._src.info import canonical_chip


@dataclasses.dataclass(frozen=True)
class CompilerParams(pltpu.CompilerParams):
    """Mosaic options of a SparseCore kernel (see ``pltpu.CompilerParams``) and ``chip``."""

    BACKEND: ClassVar[str] = "mosaic_sparsecore"

    chip: Any = None

    def __post_init__(self):
        super().__post_init__()
        if self.chip is not None:
            object.__setattr__(self, "chip", canonical_chip(self.chip))


