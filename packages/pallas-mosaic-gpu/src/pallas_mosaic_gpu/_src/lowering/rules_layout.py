"""``plgpu.layout_cast`` (and so ``plgpu.load(..., layout=)`` and
``plgpu.broadcasted_iota(..., layout=)``): a value's register layout.

A layout changes no value, only how the warpgroup holds it. Upstream reads the cast as
a conversion under ``LoweringSemantics.Lane`` and as a hint to layout inference under
``LoweringSemantics.Warpgroup``; this engine chooses every array's layout itself (one
strided layout per shape, see :mod:`values`; rules convert what they are given), so in
both semantics the cast lowers to its operand, in the layout the engine holds it in.
"""

from __future__ import annotations

from pallas_mosaic_gpu._src.layouts import layout_cast_p
from pallas_mosaic_gpu._src.lowering.engine import rule


@rule(layout_cast_p)
def _layout_cast(lctx, eqn, x):
    return x
