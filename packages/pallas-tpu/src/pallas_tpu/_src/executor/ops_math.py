"""``math`` ops as XLA computes them: the transcendental functions register from
:data:`host_xla.FUNCTIONS` (their numbers agree with XLA outside the kernel); the rest
are :data:`pallas.executor.UPSTREAM`'s. An ``arith.addf`` of an ``arith.mulf`` that both
allow contraction (``fastmath<contract>``) is one fused multiply-add, as XLA:CPU
contracts them (the lowering marks ``erf_inv``'s polynomial so)."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas.executor import cast, dtype_of, register_float_functions
from pallas_tpu._src.executor import host_xla
from pallas_tpu._src.executor.engine import OPS, op

register_float_functions(OPS, {name: host_xla.function(name) for name in host_xla.FUNCTIONS},
                         owner="pallas_tpu")


def _contracts(o) -> bool:
    return "fastmath" in o.attributes and "contract" in str(o.attributes["fastmath"])


def _fma(a, b, c, dt):
    """``a * b + c`` rounded once to ``dt`` (the product of two f32s is exact in f64)."""
    wide = np.float64 if np.dtype(dt).itemsize <= 4 else np.longdouble
    return (np.asarray(a, wide) * np.asarray(b, wide) + np.asarray(c, wide)).astype(dt)


@op("arith.addf")
def _addf(o, cc):
    dt = dtype_of(o.results[0].type)
    if _contracts(o):
        for k, v in enumerate(o.operands):
            owner = v.owner
            if (isinstance(owner, ir.OpView) and owner.operation.name == "arith.mulf"
                    and _contracts(owner.operation)):
                sa, sb = (cc.slot(x) for x in owner.operation.operands)
                other = 1 - k

                def fused(m, x, y, sa=sa, sb=sb, other=other):
                    return (_fma(m.env[sa], m.env[sb], (x, y)[other], dt),)

                return fused
    return lambda m, x, y: (cast(np.add(x, y), dt),)
