"""The lowering rule of ``dot_general`` on CUDA cores (no tensor cores yet).

Both operands are written to SMEM buffers reserved for this dot when the kernel was
built (see :func:`dot_buffers`); then each thread computes the output elements it owns
in the strided layout, looping over the contraction dimension with scalar SMEM loads
and fused multiply-adds, accumulating in float32 (or int32 for integers). Any shape
whose output the warpgroup can hold works, batch dimensions included; a ``wgmma`` path
for shapes tensor cores take is future work.
"""

from __future__ import annotations

import jax.extend.core.primitives as P
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, memref, scf
from jaxlib.mlir.dialects import math as mmath

from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import rule
from pallas_mosaic_gpu._src.lowering.spill import operand_memrefs


def _acc_dtype(dtype):
    return jnp.dtype(jnp.float32) if V.kind(dtype) == "f" else jnp.dtype(jnp.int32)


def _c(v: int) -> ir.Value:
    return V.const(v, V.index())


@rule(P.dot_general_p)
def _dot_general(lctx, eqn, a, b):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    la, ra, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
    if len(lc) != 1:
        raise NotImplementedError(f"dot_general contracting {len(lc)} dimensions at once")
    if V.kind(la.dtype) == "b" or V.kind(ra.dtype) == "b":
        raise NotImplementedError("dot_general of booleans")
    (a_ref, b_ref), _ = operand_memrefs(lctx, eqn, [a, b])
    acc_dt = _acc_dtype(out.dtype)
    acc_t = V.elem_type(acc_dt)
    shape = tuple(out.shape)
    nb = len(lb)
    lfree = [d for d in range(len(la.shape)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(ra.shape)) if d not in rc and d not in rb]
    is_small = small.is_small(shape)
    if is_small:  # every thread computes every element
        small.check_small(shape)
        elems = [[_c(i) for i in idx] for idx in np.ndindex(shape)]
    else:  # each thread the elements it owns
        elems = small.owned_indices(shape)

    def operand_index(idx, k, ndim, contract, batch, free, offset):
        out_idx = []
        for d in range(ndim):
            if d == contract:
                out_idx.append(k)
            elif d in batch:
                out_idx.append(idx[batch.index(d)])
            else:
                out_idx.append(idx[offset + free.index(d)])
        return out_idx

    zero = V.const(0, acc_t)
    loop = scf.ForOp(_c(0), _c(la.shape[lc[0]]), _c(1), [zero] * len(elems))
    with ir.InsertionPoint(loop.body):
        k = loop.induction_variable
        new = []
        for idx, acc in zip(elems, loop.inner_iter_args):
            x = memref.load(a_ref, operand_index(idx, k, len(la.shape), lc[0], list(lb),
                                                 lfree, nb))
            y = memref.load(b_ref, operand_index(idx, k, len(ra.shape), rc[0], list(rb),
                                                 rfree, nb + len(lfree)))
            x, y = V.convert(x, la.dtype, acc_dt), V.convert(y, ra.dtype, acc_dt)
            if V.kind(acc_dt) == "f":
                new.append(mmath.fma(x, y, acc))
            else:
                new.append(arith.addi(acc, arith.muli(x, y)))
        scf.YieldOp(new)
    accs = [V.convert(a, acc_dt, out.dtype) for a in loop.results]
    mgpu.warpgroup_barrier()  # every thread is done reading before the buffers are reused
    if is_small:
        return small.Small(np.array(accs, dtype=object).reshape(shape))
    return small.from_elements(shape, out.dtype, accs)
