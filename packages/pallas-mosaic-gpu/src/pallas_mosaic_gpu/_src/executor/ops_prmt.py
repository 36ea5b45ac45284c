"""PTX byte permutes: ``prmt.b32`` in its default mode, alone (Mosaic GPU's ``utils.prmt``,
used by transposed layouts) or in a straight-line block of them over ``.reg .b32``
temporaries (the look-up tables of its sub-byte upcasts).

``prmt.b32 d, a, b, c``: the eight bytes of ``{b, a}`` are numbered 0-3 (``a``, least
significant first) and 4-7 (``b``); byte ``n`` of ``d`` is the byte that nibble ``n`` of
``c`` selects by its low three bits, or, when the nibble's bit 3 is set, that byte's sign
bit replicated over all eight bits. The other modes (``.f4e``, ``.b4e``, ...) are not
matched, so they stay unsupported.
"""

from __future__ import annotations

import re

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor.engine import asm
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported

_U32 = np.uint32
_OPERAND = r"(?:\$\d+|[A-Za-z_]\w*|0[xX][0-9a-fA-F]+|\d+)"
_PRMT = rf"prmt\.b32\s+{_OPERAND}\s*,\s*{_OPERAND}\s*,\s*{_OPERAND}\s*,\s*{_OPERAND}\s*;"
_REG = r"\.reg\s+\.b32\s+[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*\s*;"
_STATEMENT = re.compile(r"\s*(\.reg\s+\.b32\s+([^;]*)|prmt\.b32\s+([^;]*));", re.S)


def prmt(a, b, c) -> np.ndarray:
    """``prmt.b32`` (default mode) of 32-bit words, elementwise, as uint32."""
    a, b, c = (np.asarray(x).astype(np.int64) & 0xFFFFFFFF for x in (a, b, c))
    pool = (b << 32) | a
    out = np.zeros(np.broadcast(a, b, c).shape, np.int64)
    for n in range(4):
        sel = (c >> (4 * n)) & 0xF
        byte = (pool >> (8 * (sel & 7))) & 0xFF
        byte = np.where(sel & 8, np.where(byte & 0x80, 0xFF, 0), byte)
        out |= byte << (8 * n)
    return out.astype(_U32)


def _parse_block(text: str) -> list[tuple[str, list[str]]]:
    """The ``prmt`` statements of a block, each ``(destination, [a, b, c])``; ``.reg``
    declarations only name temporaries."""
    body = text.strip()
    if body.startswith("{"):
        body = body[1:].rstrip()[:-1]
    stmts, pos = [], 0
    for match in _STATEMENT.finditer(body):
        if body[pos:match.start()].strip():
            raise EmulationUnsupported(f"inline PTX {text!r}")
        pos = match.end()
        if match.group(3) is not None:
            d, a, b, c = (s.strip() for s in match.group(3).split(","))
            stmts.append((d, [a, b, c]))
    if body[pos:].strip():
        raise EmulationUnsupported(f"inline PTX {text!r}")
    return stmts


@asm(rf"(?:{_PRMT})|\{{\s*(?:{_REG}\s*)*(?:{_PRMT}\s*)+\}}")
def _prmt_block(o, match):
    """A ``prmt.b32`` or a block of them: ``$k`` are the op's outputs then its inputs
    (in constraint order), other names the block's temporaries, numbers immediates."""
    stmts = _parse_block(match.group(0))
    cons = ir.StringAttr(o.attributes["constraints"]).value.split(",")
    nout = sum(c.startswith("=") for c in cons)
    if any(c not in ("=r", "r") for c in cons):
        raise EmulationUnsupported(f"prmt.b32 with operand constraints {cons}")

    def run(m, *xs):
        regs = {f"${nout + k}": np.asarray(x) for k, x in enumerate(xs)}

        def value(s):
            if s[0].isdigit():
                return np.asarray([int(s, 0)], np.int64)
            if s not in regs:
                raise EmulationUnsupported(f"prmt.b32 reads {s} before writing it")
            return regs[s]

        for d, (a, b, c) in stmts:
            regs[d] = prmt(value(a), value(b), value(c))
        outs = tuple(regs[f"${k}"].view(np.int32) for k in range(nout))
        return (outs if nout > 1 else outs[0],)

    return run
