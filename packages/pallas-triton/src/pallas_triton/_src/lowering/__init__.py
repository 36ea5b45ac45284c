"""Lowering: a Pallas kernel jaxpr plus its GridMapping -> ``triton.language`` source.

Split by concern, as pallas-tpu's lowering is:

- :mod:`.kernel`: the driver (operands, blocks, scratch, the generated function);
- :mod:`.grid`: how the Pallas grid maps onto Triton programs;
- :mod:`.engine`: the jaxpr walker, the rule table ``RULES`` (keyed by primitive
  object) and errors naming primitive, kernel and source line;
- the rules by family: :mod:`.rules_pallas` (Pallas primitives), :mod:`.rules_control`,
  :mod:`.rules_elementwise`, :mod:`.rules_shapes`, :mod:`.rules_reductions`
  (with ``dot_general``), and :mod:`.unsupported` (what is not lowered, and why).

Search for a primitive's Python name (``lax.add_p``, ``plugins.load_p``) to find its rule.
"""

from pallas_triton._src.lowering import (  # noqa: F401 - each module registers its rules
    rules_control,
    rules_elementwise,
    rules_pallas,
    rules_reductions,
    rules_shapes,
    unsupported,
)
from pallas_triton._src.lowering.engine import RULES, LoweringContext, lower_jaxpr
from pallas_triton._src.lowering.grid import sequential_axes
from pallas_triton._src.lowering.kernel import (
    LoweredKernel,
    describe,
    kernel_name,
    lower_kernel,
)

__all__ = ["RULES", "LoweredKernel", "LoweringContext", "describe", "kernel_name",
           "lower_jaxpr", "lower_kernel", "sequential_axes"]
