"""Small helpers of the public API that need no primitive."""

from __future__ import annotations

_SWIZZLES = (128, 64, 32, 16)  # bytes, largest first


def find_swizzle(minor_dim_bits: int, what: str = "") -> int:
    """The largest swizzle (in bytes: 128, 64, 32 or 16) whose span divides a minor
    dimension of ``minor_dim_bits`` bits, e.g. for ``SwizzleTransform`` of an SMEM tile.

    Raises ``ValueError`` (mentioning ``what`` when given) if no swizzle fits, i.e. when
    the minor dimension is not a multiple of 16 bytes.
    """
    for swizzle in _SWIZZLES:
        if minor_dim_bits % (swizzle * 8) == 0:
            return swizzle
    where = f" for {what}" if what else ""
    raise ValueError(
        f"No valid out swizzle{where}: minor dimension has {minor_dim_bits} bits, which is "
        "not a multiple of 128 (16 bytes)")
