"""Blackwell's tensor memory: loads and stores between registers and TMEM, copies from
SMEM into TMEM, and ``tcgen05_commit_arrive``.

``async_load_tmem``/``async_store_tmem`` move a whole TMEM ref to/from registers (the
interpreters complete them at once, so ``wait_load_tmem``/``commit_tmem`` have nothing
left to wait for); ``async_copy_smem_to_tmem`` (and its forms for block scales and
sparse metadata) copies an SMEM ref into a TMEM ref of the same shape.
"""

from __future__ import annotations

from typing import Any

import jax

from pallas.plugins import effect_primitive
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.layouts import layout_cast
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.mma import check_tensor_core_barrier

copy_smem_to_tmem_p = effect_primitive(
    "mgpu_copy_smem_to_tmem",
    lambda *a, refs, **k: {jc.ReadEffect(refs[0][0]), jc.WriteEffect(refs[1][0])})
tcgen05_commit_arrive_p = effect_primitive(
    "mgpu_tcgen05_commit_arrive", lambda *a, refs, **k: {jc.WriteEffect(refs[0][0])})


def async_load_tmem(src: Any, *, layout: Any = None) -> jax.Array:
    """Loads the TMEM ref ``src`` into registers (in ``layout``, if given)."""
    x = src[...]
    return x if layout is None else layout_cast(x, layout)


def async_store_tmem(ref: Any, value: Any) -> None:
    """Stores ``value`` from registers into the TMEM ref ``ref``."""
    ref[...] = value


def _smem_to_tmem(kind: str, smem_ref: Any, tmem_ref: Any, collective_axis: Any) -> None:
    s, t = R.view_aval(smem_ref), R.view_aval(tmem_ref)
    if kind == "scales":
        want = scales_smem_shape(t.shape)
        if want is None or tuple(s.shape) != want or s.dtype != t.dtype:
            raise ValueError(
                f"plgpu.async_copy_scales_to_tmem: smem_ref is {s.str_short()} but tmem_ref "
                f"is {t.str_short()}; block scales (MN, KB) (MN a multiple of 128, KB of 4) "
                f"are copied from SMEM in the tensor core's layout, shape "
                "(MN / 128, KB / 4, 32, 16) of the same dtype")
    elif tuple(s.shape) != tuple(t.shape) or s.dtype != t.dtype:
        raise ValueError(f"plgpu.async_copy_{kind}_to_tmem: smem_ref is {s.str_short()} but "
                         f"tmem_ref is {t.str_short()}; they must match")
    refs = R.FlatRefs(smem_ref, tmem_ref)
    copy_smem_to_tmem_p.bind(*refs.operands, refs=refs.spec, kind=kind,
                             collective_axis=collective_axis)


def scales_smem_shape(tmem_shape) -> tuple | None:
    """The SMEM shape of block scales ``(MN, KB)`` in the tensor core's layout: 128-row
    tiles of 32 rows x 4 row groups x 4 scales, ``(MN / 128, KB / 4, 32, 16)``."""
    if len(tmem_shape) != 2 or tmem_shape[0] % 128 or tmem_shape[1] % 4:
        return None
    mn, kb = tmem_shape
    return (mn // 128, kb // 4, 32, 16)


def scales_from_smem(x):
    """Block scales ``(MN, KB)`` from their SMEM layout ``(MN / 128, KB / 4, 32, 16)``:
    element ``[i, j, r, 4 g + c]`` is the scale of row ``128 i + 32 g + r`` and block
    ``4 j + c`` (upstream's ``format_scales`` inverted)."""
    t, q = x.shape[0], x.shape[1]
    return x.reshape(t, q, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(t * 128, q * 4)


def async_copy_smem_to_tmem(smem_ref: Any, tmem_ref: Any, collective_axis: Any = None
                            ) -> None:
    """Copies ``smem_ref`` into the TMEM ref ``tmem_ref`` (asynchronously, ordered with
    later ``tcgen05_mma``s)."""
    _smem_to_tmem("smem", smem_ref, tmem_ref, collective_axis)


def async_copy_scales_to_tmem(smem_ref: Any, tmem_ref: Any, collective_axis: Any = None
                              ) -> None:
    """Copies block scales for a scaled ``tcgen05_mma`` from SMEM into TMEM."""
    _smem_to_tmem("scales", smem_ref, tmem_ref, collective_axis)


def async_copy_sparse_metadata_to_tmem(smem_ref: Any, tmem_ref: Any,
                                       collective_axis: Any = None) -> None:
    """Copies sparsity metadata for a sparse ``tcgen05_mma`` from SMEM into TMEM."""
    _smem_to_tmem("sparse_metadata", smem_ref, tmem_ref, collective_axis)


def tcgen05_commit_arrive(barrier: Any, collective_axis: str | None = None) -> None:
    """Arrives on ``barrier`` once every ``tcgen05_mma`` issued so far has completed."""
    check_tensor_core_barrier(barrier, "tcgen05_commit_arrive")
    refs = R.FlatRefs(barrier)
    tcgen05_commit_arrive_p.bind(*refs.operands, refs=refs.spec, collective_axis=collective_axis)


def copied_value(kind: str, x):
    """What a copy into TMEM writes, given what it read from SMEM."""
    return scales_from_smem(x) if kind == "scales" else x


def _copy_rule(ctx, eqn, invals):
    (s, sf, st), (d, df, dt) = R.unflatten(eqn.params["refs"], invals)
    value = copied_value(eqn.params["kind"], jc.get_view(s.value, sf, st))
    d.value = jc.set_view(d.value, value, df, dt)
    return []


def _commit_arrive_rule(ctx, eqn, invals):
    R.check_not_collective(eqn, "tcgen05_commit_arrive")
    ((cell, flat, tree),) = R.unflatten(eqn.params["refs"], invals)
    cell.value = jc.set_view(cell.value, jc.get_view(cell.value, flat, tree) + 1, flat, tree)
    return []


INTERPRET_RULES = {copy_smem_to_tmem_p: _copy_rule,
                   tcgen05_commit_arrive_p: _commit_arrive_rule}


