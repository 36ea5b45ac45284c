"""The custom call a ``pallas_call`` lowers to, for both of pallas-triton's platforms.

``cuda`` (:mod:`.gpu_call`) and ``rocm`` (:mod:`.rocm_call`) differ in the call's target
and backend config; the operands, result types and input/output aliases come from the
``pallas_call`` the same way on both.
"""

from __future__ import annotations

from typing import Any

from jax.interpreters import mlir

from pallas_triton._src import jax_compat as jc


def emit_kernel_call(ctx, target: str, in_nodes, grid_mapping, out_avals,
                     **call_args: Any) -> list:
    """Emits the custom call ``target`` on the ``pallas_call``'s operands, its outputs
    aliased to inputs as ``grid_mapping.input_output_aliases`` says; ``call_args``
    (backend config, API version, layouts) go to the custom call as they are."""
    aliases = {int(i): int(o) for i, o in grid_mapping.input_output_aliases}
    result_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in out_avals]
    op = jc.custom_call(
        target,
        result_types=result_types,
        operands=list(in_nodes),
        operand_output_aliases=aliases or None,
        **call_args,
    )
    return op.results
