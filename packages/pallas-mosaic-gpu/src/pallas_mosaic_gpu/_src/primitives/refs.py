"""Refs as primitive operands: a (possibly ``ref.at[...]``-transformed) ref is bound as
its base ref followed by the flat leaves of its transforms, with a static layout."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pallas import plugins
from pallas_mosaic_gpu._src import jax_compat as jc

ref_and_transforms = plugins.ref_and_transforms
FlatRefs = plugins.RefOperands
unflatten = plugins.unpack_ref_operands
spec_end = plugins.ref_operands_end


def view_aval(ref: Any):
    """The ShapedArray that reading ``ref`` (with its transforms) would produce."""
    base, transforms = ref_and_transforms(ref)
    aval = jax.typeof(base)
    if not isinstance(aval, jc.AbstractRef):
        raise TypeError(f"expected a ref, got a value of type {aval.str_short()}")
    return jc.transform_type(list(transforms), aval.inner_aval)


def memory_space(ref: Any):
    base, _ = ref_and_transforms(ref)
    return getattr(jax.typeof(base), "memory_space", None)


def nbytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def ref_positions(spec) -> list[int]:
    """Operand positions of the base refs in ``spec``."""
    return [e[0] for e in spec if e is not None]


def check_not_collective(eqn, fn: str) -> None:
    """The reference interpreter's refusal of CTA-pair forms (``collective_axis``,
    ``leader_tracked``): it runs one block at a time, so a pair's shared tensor core,
    TMEM and barriers need GPU interpret mode (``interpret/pairs.py``)."""
    p = eqn.params
    what = [f"{k}={p[k]!r}" for k in ("collective_axis", "leader_tracked")
            if p.get(k) is not None]
    if what:
        raise NotImplementedError(
            f"plgpu.{fn}({', '.join(what)}) (CTA pairs): pallas-mosaic-gpu's reference "
            "interpreter runs one block at a time; run the kernel in GPU interpret mode "
            "(interpret=plgpu.InterpretParams(), or plgpu.kernel(..., interpret=True)), "
            "or lower it with backend 'mosaic_gpu' (interpret=False)")
