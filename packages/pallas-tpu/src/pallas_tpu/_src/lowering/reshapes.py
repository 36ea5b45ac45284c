"""Which value reshapes (``vector.shape_cast``) Mosaic TPU compiles, per chip.

A vector's last two dims are tiled (sublanes x 128 lanes); a reshape that changes them is
a relayout Mosaic implements for some shape families only. This rule accepts the families
below, each measured with libtpu (``pallas_tpu.compile`` for v5e and v6e, on the reshapes
of upstream's ``tpu_pallas_test.py`` and on random reshapes of each family, see
``docs/backend-status.md``), and refuses the rest at trace time. Leading unit dims
are free when only they change; otherwise they count ((1, n) is 2-D for Mosaic, (n,) is
1-D). With ``n`` the last dim:

- ``last2``: the last two dims are kept (only untiled leading dims change);
- ``lanes``: the last dim is kept and is a multiple of 128, any regrouping of the others
  (including the second-minor dim);
- ``sublanes``: the last dim is kept and both second-minor dims are multiples of the
  sublane tile (8 rows of 32-bit words);
- ``unfold`` / ``fold``: the last dim is split into (or merged from) several trailing dims
  ``(..., a, n)``, with ``n`` a multiple of 128, or ``a <= 24`` when ``n > 128``, or
  ``a <= 8``; between rank 1 and higher ranks only ``(m * n,) <-> (m, n)`` with ``n`` a
  power of two of at least 128;
- ``swap``: ``(..., m, n) -> (..., n, m)`` with ``n`` a multiple of ``m``, ``n <= 128``;
- ``unit minor``: a trailing unit dim added or removed; adding it to a packed type (under
  32 bits) needs TPU v6 or later.

That is the rule of v5e, v5p, v6e and 7x (the unit minor dim aside); TPU v4 relayouts
fewer shapes (:func:`_why_not_v4`). A lowering that names no chip gets v5e's rule.

Every family holds for integer and float types of 8, 16 and 32 bits (measured: float32,
int32, uint32, bfloat16, float16, int8 and three float8 types); booleans (masks) get
``last2`` and ``lanes`` with sublane-aligned second-minor dims; sub-byte types (int4)
``last2`` only.
"""

from __future__ import annotations

import numpy as np

# Chips (``pallas_tpu.compile`` names) whose Mosaic inserts a unit minor dim into packed
# types.
_UNIT_MINOR_PACKED = frozenset({"v6e", "7x"})
# A lowering that names no chip gets this chip's rule: pallas_tpu.compile's default, and
# stricter than v6e/7x's (v4's is stricter still: name the chip when lowering for v4).
DEFAULT_CHIP = "v5e"
# TPU v4 relayouts fewer shapes: of a sample of upstream's reshapes that v5e, v5p and 7x
# compile, it rejected a third (small swapped dims, unaligned last dims, 8-bit types),
# as upstream's tests expect ("TPU v5+ required").
_V4 = "v4"
_SUBLANES = 8
_LANES = 128
# A last dim over 128 that is not a multiple of 128 is split from (merged into) at most
# this many rows (the most measured).
_UNALIGNED_ROWS = 24


def _strip(shape) -> tuple[int, ...]:
    s = list(shape)
    while len(s) > 1 and s[0] == 1:
        s.pop(0)
    return tuple(s)


def _tail_split(whole: int, shape: tuple[int, ...]) -> int | None:
    """The most trailing dims of ``shape`` whose product is ``whole`` when that is at
    least 2 (a last dim split into them), else None."""
    prod, best = 1, None
    for k in range(1, len(shape) + 1):
        prod *= shape[-k]
        if prod > whole:
            break
        if prod == whole and k >= 2:
            best = k
    return best


def _split_ok(parts: tuple[int, ...], bits: int) -> bool:
    """Whether a last dim split into (or merged from) ``parts`` compiles."""
    n = parts[-1]
    if bits not in (32, 16, 8) or n == 1:
        return False
    if n % _LANES == 0:
        return True
    return parts[-2] <= (_UNALIGNED_ROWS if n > _LANES else _SUBLANES)


def why_not(src_shape, dst_shape, dtype, chip: str | None) -> str | None:
    """None when Mosaic TPU compiles ``reshape(src_shape -> dst_shape)`` of ``dtype`` on
    ``chip`` (None: :data:`DEFAULT_CHIP`); else what would work instead."""
    if _strip(src_shape) == _strip(dst_shape):
        return None  # only leading unit dims change
    # Otherwise leading unit dims count: (1, n) is laid out in 2-D tiles, (n,) in 1-D.
    s, d = tuple(src_shape), tuple(dst_shape)
    chip = chip or DEFAULT_CHIP
    dt = np.dtype(dtype)
    bits = 8 * dt.itemsize
    # Integer and float types of 8, 16 or 32 bits (float8 and float16 as int8 and
    # bfloat16: the layouts depend on the width only); not masks, not sub-byte types.
    measured = bits in (8, 16, 32) and dt.kind in "fiuV" and dt != np.bool_
    two_d = len(s) >= 2 and len(d) >= 2
    if two_d and s[-2:] == d[-2:]:
        return None  # last2
    if dt.name in ("int4", "uint4") or dt.name.startswith("float4"):
        return (f"for the sub-byte {dt.name}, only reshapes that keep the last two dims are "
                f"supported; reshape before narrowing, or after widening")
    if chip == _V4:
        return _why_not_v4(s, d, bits, measured)
    if two_d and s[-1] == d[-1] and s[-1] % _LANES == 0 and (
            dt != np.bool_ or (s[-2] % _SUBLANES == 0 and d[-2] % _SUBLANES == 0)):
        return None  # lanes (masks: sublane-aligned only)
    if two_d and measured:
        m, n = s[-2:]
        if d[-2:] == (n, m) and n % m == 0 and n <= _LANES:
            return None  # swap
    if not measured:
        return (f"for {dt.name}, only reshapes that keep the last two dims or keep a last "
                f"dim that is a multiple of 128 (and sublane-aligned second-minor dims) are "
                f"supported; reshape an integer or float value instead")
    # unit minor dim removed / added
    if s[-1] == 1 and len(s) >= 2 and s[:-1] == d:
        return None
    if d[-1] == 1 and len(d) >= 2 and d[:-1] == s:
        if bits == 32 or chip in _UNIT_MINOR_PACKED:
            return None
        return (f"adding a trailing unit dim to a {bits}-bit type needs TPU v6e or later "
                f"(the chip is {chip}); reshape a 32-bit value, or add the unit dim before "
                f"the last two")
    if len(s) >= 2 and len(d) >= 2 and s[-1] == d[-1]:
        tile = _SUBLANES * (32 // bits)
        if s[-2] % tile == 0 and d[-2] % tile == 0:
            return None  # sublanes
    if len(s) == 1 or len(d) == 1:
        # 1-D <-> 2-D: only (m * n,) <-> (m, n) with n a power of two of at least 128.
        two = d if len(s) == 1 else s
        n = two[-1]
        if len(two) == 2 and n >= _LANES and n & (n - 1) == 0:
            return None
    else:
        k = _tail_split(s[-1], d)
        if k is not None and _split_ok(d[-k:], bits):
            return None  # unfold
        k = _tail_split(d[-1], s)
        if k is not None and _split_ok(s[-k:], bits):
            return None  # fold
    return ("Mosaic TPU relayouts these reshapes of the tiled (last two) dims: keep the "
            "last two dims; keep a last dim that is a multiple of 128; split the last dim "
            "into (..., a, n) or merge such trailing dims into it, with n a multiple of "
            "128, or a <= 24 and n > 128, or a <= 8 (between rank 1 and 2 only "
            "(m * n,) <-> (m, n) with n a power of two >= 128); (..., m, n) -> "
            "(..., n, m) with n % m == 0 and n <= 128; add or drop a trailing unit dim")


def _why_not_v4(s, d, bits, measured) -> str | None:
    """TPU v4 (after ``last2``): sublane-aligned merges and splits of the second-minor dim
    (any last dim), and the last dim split or merged in multiples of 128, for 32- and
    16-bit types."""
    if measured and bits in (16, 32) and len(s) >= 2 and len(d) >= 2:
        if s[-1] == d[-1]:
            tile = _SUBLANES * (32 // bits)
            if s[-2] % tile == 0 and d[-2] % tile == 0:
                return None
        k = _tail_split(s[-1], d) or _tail_split(d[-1], s)
        if k is not None and s[-1] % _LANES == 0 and d[-1] % _LANES == 0:
            return None
    return ("on TPU v4 Mosaic relayouts only these reshapes of the tiled (last two) dims: "
            "keep the last two dims; merge or split sublane-aligned second-minor dims; "
            "split or merge the last dim in "
            "multiples of 128 (32- and 16-bit types). TPU v5e and later relayout more")


def check_reshape(src_shape, dst_shape, dtype, chip: str | None, what: str = "reshape"
                  ) -> None:
    """Raises NotImplementedError (a trace-time lowering error) naming the primitive, the
    shapes, dtype and chip when Mosaic TPU does not compile this reshape."""
    reason = why_not(src_shape, dst_shape, dtype, chip)
    if reason is None:
        return
    raise NotImplementedError(
        f"{what} from {tuple(src_shape)} to {tuple(dst_shape)} of {np.dtype(dtype).name} "
        f"on TPU {chip or f'(no chip named at lowering: {DEFAULT_CHIP}, the default)'} "
        f"is not a relayout Mosaic TPU compiles. {reason}.")
