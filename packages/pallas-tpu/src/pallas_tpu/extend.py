"""Building blocks for backends that build on pallas-tpu's Mosaic lowering.

A public, documented surface for other packages (pallas-tpu-sparsecore is the first):
the jaxpr-to-Mosaic engine, the rule table it walks, the helpers rules are written
with, and the ``tpu_custom_call`` packaging (``custom_call_options``: the call's options
that the compiler params decide). Backends import these names from here,
never from ``pallas_tpu._src``, so pallas-tpu may reorganise its internals freely.

How another backend lowers with it::

    from pallas.plugins import RuleTable
    from pallas_tpu import extend as tpx

    MY_RULES = RuleTable("my_backend lowering", "rule(lctx, eqn, *invals)",
                         parent=tpx.RULES)                   # mine, then pallas-tpu's
    MY_RULES.register(my_prim_p)(my_rule)
    lctx = tpx.LoweringContext(grid, grid_indices, name, rules=MY_RULES,
                               backend="my_backend")
    tpx.lower_jaxpr(lctx, jaxpr, consts, refs)              # at an MLIR insertion point

The DMA primitives (``dma_start_p``/``dma_wait_p``, bound by ``pltpu.async_copy`` and
friends) pack their refs with a layout ``params["refs"]``; ``unflatten_refs(spec,
operands)`` gives back ``(base, flat transforms, tree)`` per ref and ``spec_end(spec)``
the number of operands they use (device ids follow). A ref view used as an index
(``x_hbm.at[idx_ref.at[:n]]``) appears in the transforms as a :class:`RefIndex`.
:class:`SparseCoreInfo` is the type of ``pltpu.get_tpu_info_for_chip(...).sparse_core``.

A rule is ``rule(lctx, eqn, *invals) -> out`` (a list for multiple results): invals
are ``ir.Value`` (vectors, or scalars for rank 0), :class:`RefVal` (refs) or
:class:`Lit` (literals; :func:`materialize` turns one into a constant).
"""

from __future__ import annotations

from pallas_tpu._src.enums import LoweringException, MosaicUnsupported
from pallas_tpu._src.lowering import types
from pallas_tpu._src.lowering.common import (
    aval_in,
    aval_out,
    broadcast_to,
    const,
    convert,
    materialize,
    operands,
    to_i32,
    to_index,
)
from pallas_tpu._src.lowering.custom_call import (
    cost_dict,
    custom_call_options,
    side_effect_type,
)
from pallas_tpu._src.lowering.engine import lower_jaxpr
from pallas_tpu._src.lowering.kernel import new_context
from pallas_tpu._src.lowering.rules import RULES
from pallas_tpu._src.lowering.values import Lit, LoweringContext, RefVal
from pallas_tpu._src.lowering.windows import (
    Window,
    apply_transforms,
    load_window,
    store_window,
    window_indices,
    window_memref,
)
from pallas_tpu._src.memory import is_any_space
from pallas_tpu._src.primitives.dma import dma_start_p, dma_wait_p
from pallas_tpu._src.primitives.dma_indexed import RefIndex
from pallas_tpu._src.primitives.refs import spec_end
from pallas_tpu._src.primitives.refs import unflatten as unflatten_refs
from pallas_tpu._src.tpu_info import SparseCoreInfo

__all__ = [
    "Lit", "LoweringContext", "LoweringException", "MosaicUnsupported", "RULES", "RefIndex", "RefVal",
    "SparseCoreInfo", "Window",
    "apply_transforms", "aval_in", "aval_out", "broadcast_to", "const", "convert",
    "cost_dict", "custom_call_options", "dma_start_p", "dma_wait_p", "is_any_space", "spec_end",
    "unflatten_refs", "load_window", "lower_jaxpr", "materialize",
    "new_context", "operands", "side_effect_type", "store_window", "to_i32", "to_index",
    "types", "window_indices", "window_memref",
]
