"""Hopper's warpgroup matmul, ``wgmma.mma_async`` (the inline PTX Mosaic GPU emits for
it), and ``wgmma.fence``/``commit_group``/``wait_group``.

Semantics from the PTX ISA (``wgmma.mma_async``, "Matrix Descriptor Format", "Shared
Memory Matrix Layout", "Register Fragments"):

- an SMEM operand is given by a 64-bit descriptor: start address (bits 0-13), leading
  dimension byte offset (LBO, 16-29), stride dimension byte offset (SBO, 32-45), each
  encoded as ``(x & 0x3FFFF) >> 4``, base offset (49-51) and swizzle mode (62-63:
  1 = 128 B, 2 = 64 B, 3 = 32 B). Matrices are made of swizzle atoms of rows of
  ``swizzle`` bytes, 16-byte chunks; the address's bits 4.. are XORed with its bits
  7.. (as many bits as a row has chunks). K-major (``imm-trans`` 0): 8 rows of one
  atom are ``swizzle`` bytes apart, the next 8 rows ``SBO`` further, K runs along the
  row. MN-major (``imm-trans`` 1): MN runs along the row, the next ``swizzle`` bytes of
  MN are ``LBO`` further, K rows are ``swizzle`` bytes apart, the next 8 K rows ``SBO``;
- the accumulator ``D`` (64 x N) is spread over the warpgroup: thread ``t`` (warp
  ``w = t / 32``, lane ``l``) holds, for each 8 columns ``j``, ``D[16w + l/4 + 8h,
  8j + 2(l % 4) + c]`` for ``h, c`` in {0, 1} (f32/s32: one register each; f16: pairs
  packed in 32 bits);
- ``A`` in registers (16-bit types): thread ``t`` holds ``A[16w + l/4 + 8h, 8q +
  2(l % 4) + c]`` in register ``2q + h``, half ``c``;
- ``D = A @ B + (scale-d ? D : 0)``, ``imm-scale-a/b`` negate an operand when -1.

The product is computed when the instruction is issued (in float32, or int32 for
8-bit integers), from the SMEM contents at that time.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np

from pallas_mosaic_gpu._src.executor.engine import asm, no_effect, op
from pallas_mosaic_gpu._src.executor.smem_desc import smem_operand
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported

_TYPES = {"f16": np.dtype(np.float16), "bf16": np.dtype(jnp.bfloat16),
          "tf32": np.dtype(np.float32), "e4m3": np.dtype(jnp.float8_e4m3fn),
          "e5m2": np.dtype(jnp.float8_e5m2), "s8": np.dtype(np.int8),
          "u8": np.dtype(np.uint8)}

_WGMMA = (r"\{ \.reg \.pred p; setp\.ne\.b32 p, \$(?P<use>\d+), 0; "
          r"wgmma\.mma_async\.sync\.aligned\.m64n(?P<n>\d+)k(?P<k>\d+)\.(?P<d>\w+)\."
          r"(?P<a>\w+)\.(?P<b>\w+) \{(?P<acc>[^}]*)\}, (?P<aop>\{[^}]*\}|\$\d+), "
          r"\$(?P<bop>\d+), p(?P<imm>(?:, \$\d+)*); \}")


def _index(token: str) -> int:
    return int(token.strip().lstrip("$"))


def _uniform_int(x, what: str) -> int:
    x = np.asarray(x).reshape(len(np.asarray(x)), -1)[:, 0].astype(np.int64)
    if not (x == x[0]).all():
        raise EmulationUnsupported(f"wgmma with {what} that differs between threads")
    return int(x[0])


def _fragment(n: int, packed: bool):
    """(row, col) of each accumulator element a thread holds, shape (128, regs[, 2])."""
    t = np.arange(128)[:, None]
    w, lane = t // 32, t % 32
    e = np.arange(n // 2)[None, :]  # f32 order: 4 per 8 columns
    j, r = e // 4, e % 4
    row = 16 * w + lane // 4 + 8 * (r // 2)
    col = 8 * j + 2 * (lane % 4) + r % 2
    if packed:
        return row.reshape(128, -1, 2), col.reshape(128, -1, 2)
    return row, col


def _a_fragment():
    """(row, col) of the 8 16-bit elements of A each thread holds in 4 registers."""
    t = np.arange(128)[:, None]
    w, lane = t // 32, t % 32
    e = np.arange(8)[None, :]
    row = 16 * w + lane // 4 + 8 * ((e // 2) % 2)
    col = 8 * (e // 4) + 2 * (lane % 4) + e % 2
    return row, col


@asm(_WGMMA)
def _wgmma(o, match):
    g = match.groupdict()
    n, k = int(g["n"]), int(g["k"])
    acc = [_index(x) for x in g["acc"].split(",")]
    nout = len(acc)
    out, ab = g["d"], g["a"]
    if ab not in _TYPES or g["b"] != ab:
        raise EmulationUnsupported(f"wgmma with operands of types {ab} and {g['b']}")
    dtype = _TYPES[ab]
    if out not in ("f32", "f16", "s32"):
        raise EmulationUnsupported(f"wgmma with a {out} accumulator")
    a_regs = [_index(x) for x in g["aop"].strip("{}").split(",")]
    imms = [_index(x) for x in g["imm"].split(",")[1:]]
    use = _index(g["use"])
    sixteen = dtype.itemsize == 2
    if a_regs and len(a_regs) > 1 and not sixteen:
        raise EmulationUnsupported(f"wgmma with A in registers of type {ab}")
    x = lambda xs, i: xs[i - nout]  # noqa: E731 - operand $i (after the outputs)
    packed = out == "f16"
    row, col = _fragment(n, packed)
    int_acc = out == "s32"

    def run(m, *xs):
        if m.threads != 128 or (m.mask is not None and not m.mask.all()):
            raise EmulationUnsupported("wgmma issued by other than one whole warpgroup")
        vals = [_uniform_int(x(xs, i), "immediate operands") for i in imms]
        scale_a, scale_b = (vals[0], vals[1]) if ab not in ("s8", "u8") else (1, 1)
        trans = vals[2:] if sixteen else []
        if len(a_regs) == 1:
            trans_a, trans_b = (trans + [0, 0])[:2]
            a = smem_operand(m, _uniform_int(x(xs, a_regs[0]), "descriptors"), 64, k,
                             dtype, k_major=not trans_a)
        else:
            trans_b = (trans + [0])[0]
            regs = [np.broadcast_to(np.asarray(x(xs, i)).reshape(len(np.asarray(
                x(xs, i))), -1)[:, 0].astype(np.int32), (128,)) for i in a_regs]
            halves = np.stack(regs, 1).copy().view(dtype)  # (128, 8)
            a = np.zeros((64, k), dtype)
            ar, ac = _a_fragment()
            a[ar, ac] = halves
        b = smem_operand(m, _uniform_int(x(xs, _index(g["bop"])), "descriptors"), n, k,
                         dtype, k_major=not trans_b)
        if int_acc:
            prod = (a.astype(np.int64) @ b.astype(np.int64).T).astype(np.int32)
        else:
            af, bf = a.astype(np.float32), b.astype(np.float32)
            if ab == "tf32":  # tensor cores read the upper 19 bits of an f32
                af, bf = ((v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
                          for v in (af, bf))
            prod = (af * np.float32(scale_a)) @ (bf * np.float32(scale_b)).T
        regs = [np.broadcast_to(np.asarray(x(xs, nout + i)).reshape(
            len(np.asarray(x(xs, nout + i))), -1)[:, 0], (128,)) for i in range(nout)]
        c = np.stack(regs, 1)
        if packed:
            c = c.astype(np.int32).copy().view(np.float16).reshape(128, nout, 2)
        new = prod[row, col]
        if _uniform_int(x(xs, use), "the scale-d operand"):
            new = new + c.astype(new.dtype)
        if packed:
            new = new.astype(np.float16).reshape(128, -1, 2).copy().view(np.int32)
            return (tuple(new[:, i, 0] for i in range(nout)),)
        new = new.astype(np.int32 if int_acc else np.float32)
        return (tuple(new[:, i:i + 1] for i in range(nout)),)

    return run


# The product is computed at issue, so every group has completed when waited for.
op("nvvm.wgmma.commit.group.sync.aligned", "nvvm.wgmma.wait.group.sync.aligned")(no_effect)


assert re  # the pattern is compiled by ``asm``
