"""``math`` ops as XLA computes them: the transcendental functions register from
:data:`host_xla.FUNCTIONS` (their numbers agree with XLA outside the kernel); the rest
are :data:`pallas.executor.UPSTREAM`'s."""

from __future__ import annotations

from pallas.executor import register_float_functions
from pallas_tpu._src.executor import host_xla
from pallas_tpu._src.executor.engine import OPS

register_float_functions(OPS, {name: host_xla.function(name) for name in host_xla.FUNCTIONS},
                         owner="pallas_tpu")
