"""TPU value operations: ``roll``, ``bitcast``, ``einshape``, ``pack_elementwise``,
``unpack_elementwise``, ``stochastic_round``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import pallas.einshape
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.primitives._define import value_primitive


# -- roll ------------------------------------------------------------------------------------
def _roll_impl(x, shift, *, axis, stride, stride_axis):
    if stride is None:
        return jnp.roll(x, shift, axis)
    n = x.shape[stride_axis]
    parts = []
    for i in range(n):
        xi = lax.index_in_dim(x, i, stride_axis, keepdims=True)
        parts.append(jnp.roll(xi, shift + i * stride, axis))
    return jnp.concatenate(parts, axis=stride_axis)


roll_p = value_primitive("tpu_roll", _roll_impl)


def roll(x, shift, axis: int, *, stride: int | None = None, stride_axis: int | None = None):
    """Rotates ``x`` by ``shift`` along ``axis``, as ``jnp.roll``.

    With ``stride``, slice ``i`` along ``stride_axis`` is rotated by ``shift + i*stride``.
    """
    x = jnp.asarray(x)
    axis = axis % x.ndim
    if (stride is None) != (stride_axis is None):
        raise ValueError("roll: stride and stride_axis must be given together")
    if stride_axis is not None:
        stride_axis = stride_axis % x.ndim
    if isinstance(shift, int) and shift < 0:
        raise ValueError(f"roll: shift must be non-negative; got {shift}")
    return roll_p.bind(x, jnp.asarray(shift, jnp.int32), axis=axis, stride=stride,
                       stride_axis=stride_axis)


# -- bitcast ---------------------------------------------------------------------------------
def _bits(dtype) -> int:
    # Sub-byte types (int4, int2, ...) count their own bits, not their byte of storage.
    return int(jax.dtypes.itemsize_bits(dtype))


def _bitcast_impl(x, *, ty):
    ty = jnp.dtype(ty)
    s, d = _bits(x.dtype), _bits(ty)
    if s == d:
        return lax.bitcast_convert_type(x, ty)
    if x.ndim < 2:
        raise ValueError(f"bitcast between {s}- and {d}-bit types needs an array of rank >= 2")
    *lead, r, c = x.shape
    if s > d:  # each row splits into s/d rows (row-interleaved packing)
        k = s // d
        y = lax.bitcast_convert_type(x, ty)  # (..., r, c, k)
        y = jnp.swapaxes(y, -1, -2)  # (..., r, k, c)
        return y.reshape(*lead, r * k, c)
    k = d // s
    if r % k:
        raise ValueError(f"bitcast to a {d}-bit type needs rows divisible by {k}; got {r}")
    y = x.reshape(*lead, r // k, k, c)
    y = jnp.swapaxes(y, -1, -2)  # (..., r/k, c, k)
    return lax.bitcast_convert_type(y, ty)


bitcast_p = value_primitive("tpu_bitcast", _bitcast_impl)


def _bitcast_batch(args, dims, *, ty):
    # As upstream: the batched array is bitcast whole and keeps its batch axis (exact when
    # that axis is a leading one; on the second-minor axis its rows take part in the
    # packing, as on the device).
    (x,), (d,) = args, dims
    return bitcast_p.bind(x, ty=ty), d


jc.batching.primitive_batchers[bitcast_p] = _bitcast_batch


def bitcast(x, ty):
    """Reinterprets the bits of ``x`` as ``ty``.

    Between types of different widths the second-minor dimension changes: bitcasting
    f32 ``(8, 128)`` to bf16 gives ``(16, 128)``; consecutive rows pack into one.
    """
    x = jnp.asarray(x)
    s, d = _bits(x.dtype), _bits(ty)
    if s != d and x.ndim >= 2 and s < d and x.shape[-2] % (d // s):
        raise ValueError(
            f"bitcast of {x.shape} {x.dtype} to {jnp.dtype(ty)}: the second-minor dimension "
            f"{x.shape[-2]} must be a multiple of {d // s}"
        )
    return bitcast_p.bind(x, ty=jnp.dtype(ty))


# -- einshape --------------------------------------------------------------------------------
def einshape(equation: str, x, assert_is_tile_preserving: bool = False, **sizes: int):
    """Reshapes and transposes ``x`` as ``equation`` says, e.g. ``"m(nk)->nmk"``.

    Parenthesised letters on the left are split (give all but one size as keyword
    arguments); on the right they are merged. See :mod:`pallas.einshape`.
    """
    del assert_is_tile_preserving  # the Mosaic lowering checks tiles itself
    return pallas.einshape.einshape(equation, x, **sizes)


# -- pack / unpack -----------------------------------------------------------------------------
def _uint(bits: int):
    return {2: jnp.uint2, 4: jnp.uint4, 8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}[bits]


def _pack_impl(*xs, packed_dtype):
    narrow = _bits(packed_dtype)
    total = narrow * len(xs)
    out_t = _uint(total) if total in (4, 8, 16, 32) else None
    if out_t is None:
        raise ValueError(f"pack_elementwise: {len(xs)} x {narrow} bits do not fill a word")
    acc = jnp.zeros(xs[0].shape, out_t)
    for i, x in enumerate(xs):
        bits = lax.bitcast_convert_type(x.astype(packed_dtype), _uint(narrow))
        acc = acc | (bits.astype(out_t) << jnp.asarray(i * narrow, out_t))
    return acc


pack_elementwise_p = value_primitive("tpu_pack_elementwise", _pack_impl)


def pack_elementwise(xs, *, packed_dtype):
    """Converts each of ``xs`` to ``packed_dtype`` and packs them bitwise into one word.

    Element ``i`` of the result holds ``xs[0][i]`` in its low bits, then ``xs[1][i]``, ...
    The result is an unsigned integer array of the same shape.
    """
    xs = [jnp.asarray(x) for x in xs]
    if len({x.shape for x in xs}) != 1:
        raise ValueError("pack_elementwise: all inputs must have the same shape")
    return pack_elementwise_p.bind(*xs, packed_dtype=jnp.dtype(packed_dtype))


def _unpack_impl(x, *, index, packed_dtype, unpacked_dtype):
    narrow = _bits(packed_dtype)
    word = lax.bitcast_convert_type(x, _uint(_bits(x.dtype)))
    part = (word >> jnp.asarray(index * narrow, word.dtype)) & jnp.asarray(
        (1 << narrow) - 1, word.dtype)
    sub = lax.bitcast_convert_type(part.astype(_uint(narrow)), packed_dtype)
    return sub.astype(unpacked_dtype)


unpack_elementwise_p = value_primitive("tpu_unpack_elementwise", _unpack_impl)


def unpack_elementwise(x, *, index, packed_dtype, unpacked_dtype):
    """Extracts sub-element ``index`` (of type ``packed_dtype``) of each word of ``x``."""
    x = jnp.asarray(x)
    n = _bits(x.dtype) // _bits(packed_dtype)
    if not 0 <= index < n:
        raise ValueError(f"unpack_elementwise: index {index} out of range [0, {n})")
    return unpack_elementwise_p.bind(x, index=int(index), packed_dtype=jnp.dtype(packed_dtype),
                                     unpacked_dtype=jnp.dtype(unpacked_dtype))


# -- stochastic rounding -----------------------------------------------------------------------
def _stochastic_round_impl(x, random_bits, *, target_dtype):
    target_dtype = jnp.dtype(target_dtype)
    x = x.astype(jnp.float32)
    # The f32 mantissa bits the narrowing drops (23 - 7 for bf16, 23 - 10 for f16).
    drop = jnp.finfo(jnp.float32).nmant - jnp.finfo(target_dtype).nmant
    if target_dtype == jnp.float32 or drop <= 0:
        return x.astype(target_dtype)
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    mask = jnp.uint32((1 << drop) - 1)
    noise = lax.bitcast_convert_type(random_bits, jnp.uint32) & mask
    finite = jnp.isfinite(x)
    rounded = (bits + noise) & ~mask
    y = lax.bitcast_convert_type(jnp.where(finite, rounded, bits), jnp.float32)
    return y.astype(target_dtype)


stochastic_round_p = value_primitive("tpu_stochastic_round", _stochastic_round_impl)


def stochastic_round(x, random_bits, *, target_dtype):
    """Rounds float32 ``x`` to ``target_dtype`` (e.g. bf16) up or down at random.

    The bits dropped by the narrowing decide: ``random_bits`` (uint32, same shape) are
    added to them before truncation, so ``x`` rounds up with probability proportional
    to its distance from the lower neighbour.
    """
    x, random_bits = jnp.asarray(x), jnp.asarray(random_bits)
    if x.shape != random_bits.shape:
        raise ValueError("stochastic_round: x and random_bits must have the same shape")
    if jnp.dtype(target_dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16),
                                       jnp.dtype(jnp.float32)):
        raise NotImplementedError(
            f"stochastic_round to {jnp.dtype(target_dtype)} is not implemented in "
            f"pallas-tpu (backend mosaic_tpu); supported: bfloat16, float16, float32"
        )
    return stochastic_round_p.bind(x, random_bits, target_dtype=jnp.dtype(target_dtype))
