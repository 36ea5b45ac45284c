"""The effect that keeps TPU side-effecting primitives (PRNG seeding, tracing) alive."""

from __future__ import annotations

from pallas.plugins import register_kernel_local_effect
from pallas_tpu._src import jax_compat as jc


class TpuKernelEffect(jc.effects.Effect):
    """A TPU primitive with effects beyond its outputs (PRNG state, trace events)."""

    def __repr__(self) -> str:
        return "TpuKernel"


tpu_kernel_effect = TpuKernelEffect()
for _set in (jc.effects.control_flow_allowed_effects, jc.effects.lowerable_effects,
             jc.effects.remat_allowed_effects, jc.effects.custom_derivatives_allowed_effects):
    _set.add_type(TpuKernelEffect)
# Inside the kernel only: not an effect of the pallas_call (an exported kernel must load
# where pallas-tpu is not installed).
register_kernel_local_effect(TpuKernelEffect)
