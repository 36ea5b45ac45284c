"""Kernel fusion (``from pallas import fuser``), as upstream ``jax.experimental.pallas.fuser``.

Write a kernel once, fuse the ``jax.numpy`` code around it: :func:`fuse` hands a
:func:`fusible` kernel its producers and consumers as :class:`Fusion` objects, and the
kernel pulls its BlockSpecs back through them (:func:`pull_block_spec`) or pushes
them forward (:func:`push_block_spec`). The fused kernel is an ordinary ``pallas_call``.

Besides upstream's public names, this module holds what upstream keeps in private
modules and its tests use (``compare_jaxprs``, the rule registries, fusion dtypes):
rules for a backend's own primitives are registered with the ``register_*`` decorators.
"""

from pallas._src.fuser import (  # noqa: F401  (registers the rules of lax/state/prng primitives)
    rules_calls,
    rules_compute,
    rules_elementwise,
    rules_reshape,
    rules_shape,
    rules_slicing,
    rules_state,
)
from pallas._src.fuser.compare import compare_jaxprs
from pallas._src.fuser.custom_fusion import CustomEvalContext, custom_fusion, custom_fusion_p
from pallas._src.fuser.dtypes import (
    FusibleElementDType,
    FusionDType,
    pack,
    pack_dtype_p,
    physicalize,
    unpack,
    unpack_dtype_p,
)
from pallas._src.fuser.evaluate import evaluate
from pallas._src.fuser.fuse import fuse
from pallas._src.fuser.fusible import fusible, fusible_p
from pallas._src.fuser.fusion import Fusion
from pallas._src.fuser.kernel import KernelEvalContext
from pallas._src.fuser.pull import PullRuleContext, pull_block_spec
from pallas._src.fuser.push import PushRuleContext, push_block_spec
from pallas._src.fuser.registry import (
    eval_rules,
    pull_block_spec_rules,
    push_block_spec_rules,
    register_eval_rule,
    register_pull_block_spec_rule,
    register_push_block_spec_rule,
    register_usage_rule,
    usage_rules,
)
from pallas._src.fuser.transforms import (
    BlockIndexTransform,
    NoBlockIndexTransform,
    no_block_index_transform,
)
from pallas._src.fuser.usage import Usage, UsageRuleContext, compute_usage
from pallas._src.fuser.values import (
    get_fusion_values,
    get_stateful_input_fusion_values,
    get_stateful_output_fusion_values,
    make_scalar_prefetch_handler,
)

__all__ = [
    # upstream's public jax.experimental.pallas.fuser
    "BlockIndexTransform", "Fusion", "custom_fusion", "evaluate", "fuse", "fusible",
    "get_fusion_values", "get_stateful_input_fusion_values",
    "get_stateful_output_fusion_values", "make_scalar_prefetch_handler", "pull_block_spec",
    "push_block_spec",
    # rules for more primitives, and their contexts
    "register_pull_block_spec_rule", "register_push_block_spec_rule", "register_eval_rule",
    "register_usage_rule", "pull_block_spec_rules", "push_block_spec_rules", "eval_rules",
    "usage_rules", "PullRuleContext", "PushRuleContext", "KernelEvalContext",
    "UsageRuleContext", "Usage", "compute_usage", "NoBlockIndexTransform",
    "no_block_index_transform", "CustomEvalContext", "custom_fusion_p", "fusible_p",
    # fusion dtypes
    "FusionDType", "FusibleElementDType", "pack", "unpack", "pack_dtype_p", "unpack_dtype_p",
    "physicalize",
    # symbolic jaxpr equality (used to compare index maps)
    "compare_jaxprs",
]
