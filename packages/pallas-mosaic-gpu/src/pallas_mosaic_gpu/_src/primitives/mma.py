"""Tensor-core matmuls: Hopper's ``wgmma`` into a register accumulator (``plgpu.ACC``)
and Blackwell's ``tcgen05_mma`` into TMEM.

``wgmma(acc, a, b)`` adds ``a @ b`` (``a`` an SMEM ref or a register array, ``b`` an
SMEM ref, possibly ``transpose_ref``-ed) to the accumulator, in float32 for float
inputs; ``wgmma_wait(n)`` waits until at most ``n`` wgmma groups are in flight and
``acc[...]``/``wgmma_accumulator_load`` reads the result. ``tcgen05_mma(acc, a, b,
barrier)`` does the same into a TMEM ref (``accumulate=False`` overwrites) and arrives
on ``barrier`` when done; with ``a_scale``/``b_scale`` the operands are scaled per block
of K first (the block-scaled MMA). Interpreters compute the product when it is issued.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from pallas.plugins import effect_primitive
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.memory import AccumulatorSpace, MemoryRef, MemorySpace, _shaped
from pallas_mosaic_gpu._src.primitives import refs as R
from pallas_mosaic_gpu._src.primitives.barriers import check_barrier


def _mma_effects(*avals, refs, **_):
    acc, a, b, *rest = refs
    eff = {jc.WriteEffect(acc[0]), jc.ReadEffect(b[0])}
    if a is not None:
        eff.add(jc.ReadEffect(a[0]))
    if rest and rest[0] is not None:
        eff.add(jc.WriteEffect(rest[0][0]))
    eff.update(jc.ReadEffect(s[0]) for s in rest[1:])  # block scales
    return eff


wgmma_p = effect_primitive("mgpu_wgmma", _mma_effects)
wgmma_wait_p = effect_primitive("mgpu_wgmma_wait", {jc.gpu_effect})
tcgen05_mma_p = effect_primitive("mgpu_tcgen05_mma", _mma_effects)


class _Uninitialized:
    def __repr__(self) -> str:
        return "<uninitialized>"


UNINITIALIZED: Any = _Uninitialized()


@dataclasses.dataclass(frozen=True)
class WGMMAAccumulatorRef:
    """A WGMMA accumulator in registers, ``shape`` = (M, N) (M a multiple of 64),
    zero-initialised; allocate it with ``pl.run_scoped(f, plgpu.ACC((m, n)))``."""

    shape: tuple[int, int]
    dtype: Any = jnp.float32
    _init: Any = UNINITIALIZED

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if len(self.shape) != 2:
            raise ValueError(f"plgpu.ACC{self.shape}: an accumulator is 2D (M, N)")
        if self.shape[0] % 64:
            raise ValueError(f"plgpu.ACC{self.shape}: M must be a multiple of 64 (one "
                             "warpgroup's rows)")

    @staticmethod
    def init(array) -> WGMMAAccumulatorRef:
        """An accumulator starting at ``array`` (for ``pl.run_state``)."""
        return WGMMAAccumulatorRef(array.shape, array.dtype, _init=array)

    def get_memory_ref(self) -> MemoryRef:
        return _AccumulatorType(_shaped(self.shape, self.dtype), AccumulatorSpace.WGMMA)

    def get_ref_aval(self):
        if self._init is not UNINITIALIZED:
            raise ValueError(
                "Preinitialized WGMMAAccumulatorRef only supported in pl.run_state.")
        return self.get_memory_ref().get_ref_aval()


@dataclasses.dataclass(frozen=True)
class _AccumulatorType(MemoryRef):
    """The buffer type of an accumulator: starts at zero."""

    def initial_value(self):
        return jnp.zeros((), self.dtype)


ACC = WGMMAAccumulatorRef


def _run_state_initial(ref: WGMMAAccumulatorRef):
    """``pl.run_state(f)(plgpu.ACC.init(x))``: an accumulator ref starting at ``x``."""
    return ref.get_memory_ref().get_ref_aval(), (
        jc.uninitialized if ref._init is UNINITIALIZED else ref._init)


jc.ref_type_aval_mappings[WGMMAAccumulatorRef] = _run_state_initial


def _dot(a, b, out_dtype):
    if jnp.issubdtype(out_dtype, jnp.floating):
        return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(out_dtype)
    return jnp.dot(a, b, preferred_element_type=out_dtype)


def _check_mma(fn, acc_aval, a_aval, b_aval, pair: bool = False):
    """Shapes chain: ``acc (M, N) += a (M, K) @ b (K, N)``; in a CTA pair
    (``pair``) each block holds half of b's columns, ``b (K, N / 2)``."""
    (m, n), (am, ak), (bk, bn) = acc_aval.shape, a_aval.shape[-2:], b_aval.shape[-2:]
    if am != m or bn * (2 if pair else 1) != n or ak != bk:
        want = "b (K, N / 2) (this block's half of the CTA pair's b)" if pair else "b (K, N)"
        raise ValueError(
            f"plgpu.{fn}: shapes do not chain: acc {acc_aval.shape}, a {a_aval.shape}, b "
            f"{b_aval.shape}; need acc (M, N) += a (M, K) @ {want}")
    if a_aval.dtype != b_aval.dtype:
        raise ValueError(f"plgpu.{fn}: a is {a_aval.dtype} but b is {b_aval.dtype}")


def wgmma(acc: Any, a: Any, b: Any) -> None:
    """``acc += a @ b`` on the tensor cores (asynchronous; see ``wgmma_wait``)."""
    if isinstance(acc, jax.Array) or not isinstance(
            jax.typeof(R.ref_and_transforms(acc)[0]), jc.AbstractRef):
        raise TypeError("plgpu.wgmma: acc must be an accumulator ref (plgpu.ACC)")
    a_is_ref = isinstance(a, jc.TransformedRef) or isinstance(jax.typeof(a), jc.AbstractRef)
    a_aval = R.view_aval(a) if a_is_ref else jax.typeof(a)
    _check_mma("wgmma", R.view_aval(acc), a_aval, R.view_aval(b))
    refs = R.FlatRefs(acc, a if a_is_ref else None, b)
    extra = [] if a_is_ref else [a]
    wgmma_p.bind(*refs.operands, *extra, refs=refs.spec)


def wgmma_wait(n: int) -> None:
    """Waits until at most ``n`` issued wgmma groups are still running."""
    wgmma_wait_p.bind(n=int(n))


def wgmma_accumulator_load(acc: Any, *, wait_n: int | None = 0) -> jax.Array:
    """Waits (``wgmma_wait(wait_n)``, unless None) and returns the accumulator's value."""
    if wait_n is not None:
        wgmma_wait(wait_n)
    return acc[...]


def tcgen05_mma(acc: Any, a: Any, b: Any, barrier: Any = None, *, a_scale: Any = None,
                b_scale: Any = None, a_sparse_metadata: Any = None,
                accumulate: bool | jax.Array = True, collective_axis: str | None = None
                ) -> None:
    """``acc (TMEM) = (acc if accumulate else 0) + a @ b``; arrives on ``barrier`` when
    done. With ``a_scale``/``b_scale`` (TMEM block scales, see :func:`scaled_operands`)
    it is the block-scaled MMA. Sparse ``a_sparse_metadata`` is not supported yet."""
    if a_sparse_metadata is not None:
        raise NotImplementedError(
            "plgpu.tcgen05_mma with a_sparse_metadata (sparse MMA) is not supported by "
            "pallas-mosaic-gpu yet")
    _check_mma("tcgen05_mma", R.view_aval(acc), R.view_aval(a), R.view_aval(b),
               pair=collective_axis is not None)
    _check_spaces(acc, a, b)
    if (a_scale is None) != (b_scale is None):
        raise ValueError("plgpu.tcgen05_mma: a_scale and b_scale must be both present or "
                         "both unspecified")
    scales = ()
    if a_scale is not None:
        if collective_axis is not None:
            raise NotImplementedError(
                "plgpu.tcgen05_mma with a_scale/b_scale and collective_axis (a block-scaled "
                "CTA-pair MMA) is not supported by pallas-mosaic-gpu yet")
        _check_scales(R.view_aval(a), R.view_aval(b), a_scale, b_scale)
        scales = (a_scale, b_scale)
    if barrier is not None:
        check_tensor_core_barrier(barrier, "tcgen05_mma")
    refs = R.FlatRefs(acc, a, b, barrier, *scales)
    tcgen05_mma_p.bind(*refs.operands, jnp.asarray(accumulate, jnp.bool_), refs=refs.spec,
                       collective_axis=collective_axis)


SCALE_DTYPES = {32: ("float8_e8m0fnu",), 16: ("float8_e8m0fnu", "float8_e4m3fn")}


def _check_scales(a_aval, b_aval, a_scale, b_scale) -> None:
    """Block scales: ``a_scale (M, K / block)``, ``b_scale (N, K / block)`` TMEM refs of
    one scale per ``block`` (32, or 16 for 4-bit operands) consecutive elements of K."""
    (m, k), (_, n) = a_aval.shape[-2:], b_aval.shape[-2:]
    sa, sb = R.view_aval(a_scale), R.view_aval(b_scale)
    for arg, ref, aval, rows in (("a_scale", a_scale, sa, m), ("b_scale", b_scale, sb, n)):
        space = R.memory_space(ref)
        if isinstance(space, MemorySpace) and space.value != "tmem":
            raise ValueError(f"plgpu.tcgen05_mma: {arg} must be a TMEM ref, got a "
                             f"{space.value.upper()} ref")
        if len(aval.shape) != 2 or aval.shape[0] != rows or not aval.shape[1] or (
                k % aval.shape[1]):
            raise ValueError(f"plgpu.tcgen05_mma: {arg} is {aval.str_short()}; it must be "
                             f"({rows}, K / block) for K = {k}")
    block = k // sa.shape[1]
    if sb.shape[1] != sa.shape[1] or block not in SCALE_DTYPES or any(
            x.dtype.name not in SCALE_DTYPES[block] for x in (sa, sb)) or sa.dtype != sb.dtype:
        raise ValueError(
            f"plgpu.tcgen05_mma: a_scale {sa.str_short()} and b_scale {sb.str_short()} for "
            f"K = {k}: both must hold one scale per block of 32 elements of K "
            "(float8_e8m0fnu) or of 16 (float8_e8m0fnu or float8_e4m3fn), of one dtype")


def scaled_operands(a, b, a_scale, b_scale):
    """The block-scaled MMA's operands in float32: ``a * a_scale`` and ``b * b_scale``,
    each scale repeated over its block of K (upstream's reference:
    ``dot(a * repeat(a_scale, block, 1), (b.T * repeat(b_scale, block, 1)).T)``)."""
    block = a.shape[-1] // a_scale.shape[-1]
    sa = jnp.repeat(jnp.asarray(a_scale).astype(jnp.float32), block, axis=1)
    sb = jnp.repeat(jnp.asarray(b_scale).astype(jnp.float32), block, axis=1)
    return (jnp.asarray(a).astype(jnp.float32) * sa,
            jnp.asarray(b).astype(jnp.float32) * sb.T)


def _check_spaces(acc, a, b) -> None:
    """Upstream's memory-space rules for ``tcgen05_mma`` (acc TMEM, a SMEM/TMEM, b SMEM),
    where a ref's space is known."""
    for arg, ref, ok in (("acc", acc, ("tmem",)), ("a", a, ("smem", "tmem")),
                         ("b", b, ("smem",))):
        space = R.memory_space(ref)
        if isinstance(space, MemorySpace) and space.value not in ok:
            raise ValueError(
                f"plgpu.tcgen05_mma: {arg} is a {space.value.upper()} ref; it must be a "
                f"{'/'.join(s.upper() for s in ok)} ref")


def check_tensor_core_barrier(barrier, fn: str) -> None:
    """A barrier tcgen05 operations arrive on must order the tensor core (upstream's
    rule), so that waiting on it also fences their TMEM writes."""
    space = check_barrier(barrier, fn)
    if not space.orders_tensor_core:
        raise ValueError(
            f"plgpu.{fn}: MMA barrier must have orders_tensor_core set to True "
            "(plgpu.Barrier(..., orders_tensor_core=True))")


def mma_operands(spec, invals, read):
    """(acc view, a value, b value) of a wgmma/tcgen05 equation; ``read(buf, flat, tree)``
    reads a ref view (the interpreter's own, so it can log the access)."""
    acc, a, b, *_ = R.unflatten(spec, invals)
    a_val = read(*a) if a is not None else invals[R.spec_end(spec)]
    return acc, a_val, read(*b)


# -- reference interpreter rules ---------------------------------------------------------


def _cell_read(cell, flat, tree):
    return jc.get_view(cell.value, flat, tree)


def wgmma_rule(ctx, eqn, invals):
    (cell, flat, tree), a, b = mma_operands(eqn.params["refs"], invals, _cell_read)
    old = jc.get_view(cell.value, flat, tree)
    cell.value = jc.set_view(cell.value, old + _dot(a, b, old.dtype), flat, tree)
    return []


def tcgen05_rule(ctx, eqn, invals):
    R.check_not_collective(eqn, "tcgen05_mma")
    spec = eqn.params["refs"]
    (cell, flat, tree), a, b = mma_operands(spec, invals, _cell_read)
    entries = R.unflatten(spec, invals)
    if len(entries) > 4:  # block-scaled
        a, b = scaled_operands(a, b, *(_cell_read(*e) for e in entries[4:6]))
    accumulate = invals[R.spec_end(spec)]
    old = jc.get_view(cell.value, flat, tree)
    new = jnp.where(accumulate, old, jnp.zeros_like(old)) + _dot(a, b, old.dtype)
    cell.value = jc.set_view(cell.value, new, flat, tree)
    bar = entries[3]
    if bar is not None:
        bcell, bflat, btree = bar
        count = jc.get_view(bcell.value, bflat, btree)
        bcell.value = jc.set_view(bcell.value, count + 1, bflat, btree)
    return []


INTERPRET_RULES = {wgmma_p: wgmma_rule, wgmma_wait_p: lambda ctx, eqn, invals: [],
                   tcgen05_mma_p: tcgen05_rule}
