"""The TPU rules, checked at trace time with errors that name the operand.

- Blocks in VMEM: the last two block dims must be multiples of 8 and 128 or equal the
  array's dims (squeezed dims excepted); for rank-1 blocks the one dim follows the
  128 rule. This is upstream's documented rule, for every dtype (packed 16- and 8-bit
  types tile more rows per vreg, which Mosaic handles), except that XLA tiles a 1-D
  array of a 16-bit (8-bit) dtype by 256 (512) elements, so its rank-1 blocks must be
  multiples of that (Mosaic rejects them otherwise: CompileTimeMosaicMisalignedBlock
  AndTiling), as upstream checks.
- Dtypes: Mosaic TPU has no 64-bit, complex, 2-bit or fp4 types in kernels. int4/uint4
  operands are its i4 (loaded, stored, widened, selected; Mosaic refuses arithmetic on
  them with its own message, a ``MosaicError``, as on the chip).
- ``dimension_semantics`` has one entry per grid dimension;
  ``allow_input_fusion`` one entry per input.
- SMEM holds scalars of any kernel dtype (Mosaic loads, stores and converts them; scalar
  arithmetic other than i32/f32 it rejects, as ``pallas_tpu.errors.MosaicError``).
- Every primitive in the kernel has a Mosaic lowering rule.
"""

from __future__ import annotations

import jax.numpy as jnp

import pallas as pl
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.compiler_params import CompilerParams
from pallas_tpu._src.lowering.keys import physicalize
from pallas_tpu._src.lowering.rules import RULES
from pallas_tpu._src.lowering.types import memory_dtype
from pallas_tpu._src.memory import MemorySpace, canonical_space
from pallas_tpu._src.vmem import check_vmem

LANES, SUBLANES = 128, 8

def dtype_problem(dtype) -> str | None:
    """Why Mosaic TPU cannot hold ``dtype`` in a kernel, or None."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        return None  # extended dtypes (semaphores, keys) are handled elsewhere
    name = dt.name
    if dt.kind == "c":
        return f"{name} (complex numbers are not supported by Mosaic TPU)"
    if dt.itemsize == 8:
        return f"{name} (64-bit types are not supported by Mosaic TPU; use 32-bit types)"
    if name in ("int2", "uint2", "float4_e2m1fn"):
        return (f"{name} (sub-byte types are not supported in pallas-tpu kernels; pack them "
                f"into int8/int32 and use pltpu.bitcast or pltpu.unpack_elementwise)")
    return None


def _check_block(bm) -> None:
    space = canonical_space(bm.memory_space)
    problem = dtype_problem(bm.array_aval.dtype)
    if problem:
        raise TypeError(f"pallas_call operand {bm.origin} has unsupported dtype {problem}")
    if space in (MemorySpace.ANY, MemorySpace.HBM, MemorySpace.HOST):
        return
    for d in bm.block_dims:
        if type(d).__name__ == "Indirect":
            raise NotImplementedError(
                f"pallas_call operand {bm.origin}: {type(d).__name__} block dims are not "
                f"implemented yet in pallas-tpu (backend 'mosaic_tpu'); use Blocked dims"
            )
    element_window = any(isinstance(d, (pl.Element, pl.BoundedSlice)) for d in bm.block_dims)
    if element_window:
        for i, (d, n) in enumerate(zip(bm.block_dims, bm.array_aval.shape)):
            if isinstance(d, pl.Blocked) and n % d.block_size:
                raise NotImplementedError(
                    f"pallas_call operand {bm.origin} has Element/BoundedSlice block dims "
                    f"and a Blocked dim {i} of size {d.block_size} that does not divide the "
                    f"array dim {n}; pallas-tpu (backend 'mosaic_tpu') lowers such a window "
                    f"in element offsets, where edge blocks cannot overhang. Use "
                    f"pl.Element({d.block_size}, padding=...) for that dim"
                )
    if space is MemorySpace.SMEM:
        # Any kernel dtype: Mosaic (libtpu) loads and stores 4- to 32-bit scalars of every
        # kind in SMEM (bools as int32, as in VMEM); scalar arithmetic it does only in
        # i32/f32, refusing the rest itself (a MosaicError, as on the chip).
        return
    if bm.whole:
        return
    shape = bm.array_aval.shape
    rank = len(shape)
    block = bm.block_shape
    dims = bm.block_dims
    lanes = LANES
    if rank == 1:  # XLA's 1-D tiling packs 32 bits per lane
        lanes = LANES * max(1, 4 // memory_dtype(bm.array_aval.dtype).itemsize)
    for i, need in ((rank - 1, lanes), (rank - 2, SUBLANES)):
        # A squeezed dim is a block of 1 here: XLA tiles the array's last two dims
        # (e.g. (2, 128) for a (2, 32) f32 array), which a 1-row window must divide.
        if i < 0:
            continue
        b, n = block[i], shape[i]
        if isinstance(dims[i], pl.Element):
            n += sum(dims[i].padding)  # an Element window spans the padded array
        if b == n or b % need == 0:
            continue
        which = "last" if i == rank - 1 else "second-to-last"
        raise ValueError(
            f"Block shape for {bm.origin} (= {tuple(block)}) is not supported by Mosaic TPU: "
            f"the {which} block dimension {b} must be divisible by {need} or equal to the "
            f"array dimension {n} (array shape {tuple(shape)}, dtype "
            f"{jnp.dtype(bm.array_aval.dtype).name}). The last two block dims must be "
            f"multiples of (8, 128) or the full array dims"
            + (f"; a rank-1 block of this dtype, a multiple of {lanes}" if lanes != LANES
               else "") + "."
        )


def _check_scratch(origin, t) -> None:
    space = canonical_space(t.memory_space)
    if getattr(space, "is_semaphore", False):
        return
    problem = dtype_problem(t.dtype)
    if problem:
        raise TypeError(f"scratch buffer {origin} has unsupported dtype {problem}")
    if space is MemorySpace.SMEM and jnp.dtype(t.dtype).itemsize != 4:
        raise TypeError(f"scratch buffer {origin} in SMEM must have a 32-bit dtype; got "
                        f"{jnp.dtype(t.dtype).name}")


def _walk_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jc.core.jaxprs_in_params(eqn.params):
            yield from _walk_eqns(sub)


def _check_primitives(jaxpr) -> None:
    for eqn in _walk_eqns(jaxpr):
        if eqn.primitive not in RULES:
            reason = RULES.unsupported_reason(eqn.primitive)
            raise NotImplementedError(
                f"The kernel uses the primitive '{eqn.primitive.name}', which pallas-tpu "
                f"(backend 'mosaic_tpu') cannot lower to Mosaic TPU yet"
                f"{' (' + reason + ')' if reason else ''}. "
                f"It runs under interpret=True. At: {jc.source_info_summary(eqn)}"
            )
        for v in eqn.outvars:
            aval = v.aval
            if hasattr(aval, "dtype") and not isinstance(aval, jc.AbstractRef):
                problem = dtype_problem(aval.dtype)
                if problem:
                    raise TypeError(
                        f"The kernel computes a value of unsupported dtype {problem} in "
                        f"'{eqn.primitive.name}' at {jc.source_info_summary(eqn)}"
                    )


def validate(jaxpr, gm, params: CompilerParams, name: str = "kernel") -> None:
    """Raises a clear error when Mosaic TPU cannot run the kernel as written (a kernel
    with typed PRNG keys as it is lowered: over their key data)."""
    jaxpr, gm = physicalize(jaxpr, gm)
    if params.dimension_semantics is not None and len(params.dimension_semantics) != len(gm.grid):
        raise ValueError(
            f"pltpu.CompilerParams(dimension_semantics=...) has "
            f"{len(params.dimension_semantics)} entries but the grid {gm.grid} has "
            f"{len(gm.grid)} dimensions"
        )
    if params.allow_input_fusion is not None and len(params.allow_input_fusion) != (
            gm.num_scalar_prefetch + gm.num_inputs):
        raise ValueError(
            f"pltpu.CompilerParams(allow_input_fusion=...) has "
            f"{len(params.allow_input_fusion)} entries but pallas_call has "
            f"{gm.num_scalar_prefetch + gm.num_inputs} inputs"
        )
    for i, a in enumerate(gm.prefetch_avals):
        if jnp.dtype(a.dtype).itemsize > 4:
            raise TypeError(
                f"scalar prefetch operand {i} has dtype {jnp.dtype(a.dtype).name}; scalar "
                f"prefetch operands live in SMEM and must have a dtype of at most 32 bits "
                f"(e.g. int32, or int8 for compact tables)"
            )
    for bm in gm.block_mappings:
        _check_block(bm)
    for origin, t in zip(gm.scratch_origins, gm.scratch_types):
        _check_scratch(origin, t)
    _check_primitives(jaxpr.jaxpr)
    check_vmem(gm, params, name)
