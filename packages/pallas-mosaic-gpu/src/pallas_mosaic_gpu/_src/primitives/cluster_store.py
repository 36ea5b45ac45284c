"""``async_store_smem``: an asynchronous store of an array into the SMEM of a block of
this cluster (``st.async`` into distributed shared memory), arriving on that block's
barrier once the data has landed; with ``atomic`` it combines into the target instead.

Reference interpreter: it runs one block at a time, so it refuses this primitive; GPU
interpret mode simulates it (``interpret/tma.py``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp

from pallas.plugins import effect_primitive
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.memory import SMEM
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.barriers import check_barrier

ATOMICS = ("add", "max", "min", "and", "or", "xor")


def _effects(*avals, refs, **_):
    ref, bar = refs
    return {jc.WriteEffect(ref[0]), jc.WriteEffect(bar[0])}


async_store_smem_p = effect_primitive("mgpu_async_store_smem", _effects)


def async_store_smem(src: jax.Array, ref: Any, barrier: Any, *, cluster_idx: jax.Array,
                     cluster_dim: Hashable, optimized: bool = True,
                     atomic: str | None = None) -> None:
    """Stores ``src`` into ``ref`` in the SMEM of the block at ``cluster_idx`` along the
    cluster axis ``cluster_dim`` and arrives on that block's ``barrier`` (one arrival)
    when done; ``atomic`` (``"add"``, ``"max"``, ...) combines into ``ref`` instead."""
    fn = "async_store_smem"
    space = R.memory_space(ref)
    if space is not None and space is not SMEM:
        raise TypeError(f"plgpu.{fn}: ref must be in SMEM, got {space}")
    check_barrier(barrier, fn)
    src = jnp.asarray(src)
    view = R.view_aval(ref)
    if not src.shape:
        raise NotImplementedError(f"plgpu.{fn}: Scalars are not supported in async_store_smem")
    if tuple(src.shape) != tuple(view.shape):
        raise TypeError(f"plgpu.{fn}: The stored value has shape {src.shape}, but the "
                        f"target reference has shape {view.shape}")
    if src.dtype != view.dtype:
        raise TypeError(f"plgpu.{fn}: The stored value has dtype {src.dtype}, but the "
                        f"target reference has dtype {view.dtype}")
    op = None if atomic is None else str(getattr(atomic, "value", atomic)).lower()
    if op is not None and op not in ATOMICS:
        raise ValueError(f"plgpu.{fn}(atomic={atomic!r}): must be one of {ATOMICS} or None")
    refs = R.FlatRefs(ref, barrier)
    async_store_smem_p.bind(src, *refs.operands, jnp.asarray(cluster_idx, jnp.int32),
                            refs=tuple((p + 1, n, t) for p, n, t in refs.spec),
                            cluster_dim=cluster_dim, optimized=bool(optimized), atomic=op)


def _refuse(ctx, eqn, invals):
    raise NotImplementedError(
        "plgpu.async_store_smem stores into another block's SMEM: pallas-mosaic-gpu's "
        "reference interpreter runs one block at a time; run the kernel in GPU interpret "
        "mode (interpret=plgpu.InterpretParams())")


INTERPRET_RULES = {async_store_smem_p: _refuse}
