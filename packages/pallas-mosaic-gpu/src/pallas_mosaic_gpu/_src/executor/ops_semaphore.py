"""Semaphores in global memory: the inline PTX Mosaic GPU emits for ``pl.semaphore_signal``
and ``pl.semaphore_wait`` on a GMEM semaphore (``pl.get_global``, a semaphore in a
``plgpu.kernel``'s scratch): ``red.add`` to signal, a spin loop of ``atom.cas`` (a
decrementing wait) or ``ld`` (a non-decrementing one), and the ``fence``s around them.

The executor runs the strands of a block as coroutines and the blocks of a grid one
after another (cluster by cluster). A wait whose count is not there yet lets the other
strands of its block run until the semaphore's word changes; when none can change it the
run stops with the scheduler's deadlock error, naming the semaphore: on the hardware a
later block might signal it, which the executor cannot model (its blocks do not run
concurrently).
"""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor.engine import asm

_U32 = np.uint32
# A non-decrementing wait re-reads the word until the count is there; after this many
# reads of an unchanged value by one op, the reader yields to the block's other strands.
_SPINS = 64


def _lane(x, i: int) -> int:
    a = np.asarray(x).reshape(-1)
    return int(a[i if a.shape[0] > 1 else 0])


def _word(m, addr: int) -> int:
    return int(m.memory.gather(np.asarray([addr], np.int64), _U32)[0])


def _set_word(m, addr: int, value: int) -> None:
    m.memory.scatter(np.asarray([addr], np.int64), np.asarray([value & 0xFFFFFFFF], _U32))


def _wait_for_change(m, addr: int, seen: int, why: str) -> None:
    m.block.wait_until(
        m, lambda: _word(m, addr) != seen,
        lambda: (f"a wait on the global semaphore at {addr:#x} ({why}; it holds {seen}): "
                 f"no strand of this block can signal it, and the executor runs the "
                 f"grid's blocks one after another, so a later block cannot either"))


@asm(r"@\$2 red\.(?:release|relaxed)\.(?:sys|gpu)\.global\.add\.u32 \[\$0\], \$1;")
def _red_add(o, match):
    """``semaphore_signal``: each predicated lane adds its value to the word."""

    def run(m, ptr, value, pred):
        for i in m.lanes(pred):
            addr = _lane(ptr, i)
            _set_word(m, addr, _word(m, addr) + (_lane(value, i) & 0xFFFFFFFF))

    return run


@asm(r"atom\.relaxed\.(?:sys|gpu)\.global\.cas\.b32 \$0, \[\$1\], \$2, \$3;")
def _cas(o, match):
    """A decrementing wait's step: compare-and-swap, returning the old word. A lane
    whose word is below the count it waits for (``expected - new``) waits for the word
    to change before the loop tries again."""

    def run(m, ptr, expected, new):
        out = np.zeros(m.threads, np.int32)
        for i in m.lanes():
            addr = _lane(ptr, i)
            exp, nw = _lane(expected, i) & 0xFFFFFFFF, _lane(new, i) & 0xFFFFFFFF
            old = _word(m, addr)
            if old == exp:
                _set_word(m, addr, nw)
            elif old < ((exp - nw) & 0xFFFFFFFF):
                _wait_for_change(m, addr, old, f"it waits for {(exp - nw) & 0xFFFFFFFF}")
            out[i] = np.asarray(old, _U32).view(np.int32)
        return (out,)

    return run


@asm(r"ld\.relaxed\.(?:sys|gpu)\.global\.b32 \$0, \[\$1\];")
def _ld(o, match):
    """A non-decrementing wait's read of the word."""
    last: dict = {}  # (strand, lane) -> (value, times read unchanged)

    def run(m, ptr):
        out = np.zeros(m.threads, np.int32)
        for i in m.lanes():
            addr = _lane(ptr, i)
            v = _word(m, addr)
            key = (id(m), i)
            seen, n = last.get(key, (None, 0))
            n = n + 1 if seen == v else 1
            last[key] = (v, n)
            if n >= _SPINS:
                last.pop(key)
                _wait_for_change(m, addr, v, "it reads the same count again and again")
            out[i] = np.asarray(v, _U32).view(np.int32)
        return (out,)

    return run


@asm(r"fence\.(?:acquire|release|acq_rel|sc)\.(?:sys|gpu|cta);")
def _fence(o, match):
    """Memory fences: every access of the executor completes before the next op, so a
    fence orders nothing more."""
    return lambda m: None


# Atomic stores (``plgpu.atomic_add`` and friends: Mosaic GPU's FragmentedArray stores
# with ``atomic=``): ``red[.shared::cta].relaxed.{cta,gpu}.OP[.noftz][.vN].TYPE [$0], ...``
# combines each lane's registers into consecutive elements at its address.
_RED_TYPES = {"f32": np.float32, "s32": np.int32, "u32": np.uint32, "b32": np.uint32,
              "f16x2": np.float16, "f16": np.float16, "bf16x2": "bfloat16",
              "bf16": "bfloat16"}
_RED_OPS = {"add": np.add, "max": np.maximum, "min": np.minimum, "and": np.bitwise_and,
            "or": np.bitwise_or, "xor": np.bitwise_xor}


def _red_dtype(name: str) -> np.dtype:
    t = _RED_TYPES[name]
    if t == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(t)


@asm(r"red(?:\.shared::cta)?\.relaxed\.(?:cta|gpu)\.(add|max|min|and|or|xor)(?:\.noftz)?"
     r"(?:\.v\d)?\.(f32|s32|u32|b32|f16x2|bf16x2|f16|bf16) \[\$0\], "
     r"(?:\{[$\d, ]+\}|\$1);")
def _red(o, match):
    """An atomic store: each active lane combines its operands' elements into memory at
    its address, one lane after another (so lanes hitting one address all count)."""
    ufunc, dt = _RED_OPS[match.group(1)], _red_dtype(match.group(2))

    def run(m, ptr, *regs):
        lanes = m.lanes()
        if not len(lanes):
            return
        raw = [np.ascontiguousarray(np.broadcast_to(
            np.asarray(r).reshape(len(np.asarray(r)), -1)[:, 0], (m.threads,)))
            for r in regs]
        data = np.concatenate([r[:, None].view(np.uint8) for r in raw], axis=1)
        vals = data[lanes].view(dt)  # (lanes, elements)
        base = np.broadcast_to(np.asarray(ptr, np.int64).reshape(-1), (m.threads,))[lanes]
        addrs = base[:, None] + np.arange(vals.shape[1]) * dt.itemsize
        flat_addrs, flat_vals = addrs.reshape(-1), vals.reshape(-1)
        uniq, inv = np.unique(flat_addrs, return_inverse=True)
        acc = m.memory.gather(uniq, dt)
        with np.errstate(all="ignore"):
            ufunc.at(acc, inv, flat_vals)
        m.memory.scatter(uniq, acc)

    return run
