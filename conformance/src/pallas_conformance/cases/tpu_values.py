"""TPU value primitives of ``pallas_tpu`` inside kernels: ``pltpu.roll`` with a stride
(each row rotated by a shift that grows with the row), of a packed type, and
``pltpu.bitcast`` between element types of different widths (the narrower values packed
along the second-minor dim, rows ``2k`` and ``2k + 1`` of bf16 in the low and high halves
of row ``k`` of u32).

The kernels use ``pallas_tpu``, so these cases are registered only when it is installed;
a backend that claims ``tpu_values`` runs them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_conformance.registry import case, randn, sds

pltpu = None
try:  # the TPU frontend; without it there are no such cases
    import pallas_tpu as pltpu
except ImportError:  # pragma: no cover - depends on the installed packages
    pass

C = 128


def _strided_roll_reference(x, shift, stride):
    x = np.asarray(x)
    return np.concatenate([np.roll(x[i:i + 1], shift + i * stride, axis=1)
                           for i in range(x.shape[0])])


def _bitcast_bf16_rows_to_u32(x):
    r, c = x.shape
    pairs = jnp.swapaxes(x.reshape(r // 2, 2, c), -1, -2)  # (r/2, c, 2): low half first
    return lax.bitcast_convert_type(pairs, jnp.uint32)


if pltpu is not None:
    @case("tpu_values/roll_strided_bf16", tags={"tpu_values", "bf16"},
          inputs=lambda rng: (randn(rng, (16, 2 * C), jnp.bfloat16),),
          reference=lambda x: _strided_roll_reference(x, 3, 2))
    def roll_strided_bf16(pallas_call, x):
        """``pltpu.roll(x, 3, 1, stride=2, stride_axis=0)`` of a bf16 block: row ``i``
        rotated by ``3 + 2 i`` lanes (upstream's
        ``test_roll_static_lane_shift_with_stride_and_aligned_shape``)."""
        def kernel(x_ref, o_ref):
            o_ref[...] = pltpu.roll(x_ref[...], 3, 1, stride=2, stride_axis=0)

        return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)

    @case("tpu_values/bitcast_bf16_to_u32", tags={"tpu_values", "bf16", "uint32"},
          inputs=lambda rng: (randn(rng, (16, 2 * C), jnp.bfloat16),),
          reference=_bitcast_bf16_rows_to_u32)
    def bitcast_bf16_to_u32(pallas_call, x):
        """``pltpu.bitcast`` of a (16, 256) bf16 value to (8, 256) u32 (upstream's
        ``test_bfloat16_to_uint32_bitcast``)."""
        def kernel(x_ref, o_ref):
            o_ref[...] = pltpu.bitcast(x_ref[...], jnp.uint32)

        return pallas_call(kernel, out_shape=sds((8, 2 * C), jnp.uint32))(x)

    @case("tpu_values/trace_value", tags={"tpu_values"},
          inputs=lambda rng: (randn(rng, (8, C)),), reference=lambda x: x * 2.0 + 1.0)
    def trace_value(pallas_call, x):
        """``pltpu.trace_value`` of a constant and of a computed scalar: a profiler
        annotation that leaves the result alone (upstream's ``tpu_trace_value_test``)."""
        def kernel(x_ref, o_ref):
            pltpu.trace_value("constant", jnp.float32(42.0))
            y = x_ref[...] * 2.0
            pltpu.trace_value("first", y[0, 0])
            o_ref[...] = y + 1.0

        return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x)
