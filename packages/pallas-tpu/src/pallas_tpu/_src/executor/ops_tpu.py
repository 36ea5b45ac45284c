"""``tpu`` dialect ops: layout-free vector ops, strided/masked memory access, matmul,
semaphores and DMAs (the data of a DMA lands when it is waited for)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
from jaxlib.mlir import ir

from pallas.executor import ExecutorError, bits, elem_and_shape, unsigned
from pallas.executor import dtype_of as np_dtype
from pallas.executor import run as run_plan
from pallas_tpu._src import prng_model
from pallas_tpu._src.executor import host_xla
from pallas_tpu._src.executor.derived import DerivedRef, bitcast, pack, unpack
from pallas_tpu._src.executor.engine import op
from pallas_tpu._src.executor.ops_vector import i64s, window


@op("tpu.assume_multiple")
def _assume_multiple(o, cc):
    return lambda m, x: (x,)


@op("tpu.trace_start", "tpu.trace_stop")
def _trace(o, cc):
    # Profiler annotations (jax.named_scope): nothing to compute.
    return lambda m: ()


@op("tpu.trace_value")
def _trace_value(o, cc):
    # pltpu.trace_value: the chip records the value in the profiler's trace; no result.
    return lambda m, value: ()


@op("tpu.region")
def _region(o, cc):
    # A scope for ``memref.alloca``: its body runs once, in place.
    body = cc.region(o.regions[0])
    return lambda m: run_plan(body, m, m.env)


@op("tpu.iteration_bound")
def _iteration_bound(o, cc):
    d = ir.IntegerAttr(o.attributes["dim"]).value
    return lambda m: (np.int32(m.grid[d]),)


@op("tpu.iota")
def _iota(o, cc):
    dt, shape = elem_and_shape(o.result.type)
    dims = i64s(o.attributes["dimensions"])
    if len(dims) != 1:
        raise ExecutorError(f"tpu.iota over dimensions {dims}: only one is supported")
    d = dims[0]
    val = np.broadcast_to(
        np.arange(shape[d], dtype=dt).reshape([-1 if i == d else 1 for i in range(len(shape))]),
        shape)
    return lambda m: (val,)


@op("tpu.transpose")
def _transpose(o, cc):
    perm = i64s(o.attributes["permutation"])
    return lambda m, x: (np.transpose(x, perm),)


@op("tpu.concatenate")
def _concatenate(o, cc):
    d = ir.IntegerAttr(o.attributes["dimension"]).value
    return lambda m, *xs: (np.concatenate(xs, axis=d),)


@op("tpu.dynamic_rotate")
def _dynamic_rotate(o, cc):
    d = ir.IntegerAttr(o.attributes["dimension"]).value
    stride = ir.IntegerAttr(o.attributes["stride"]).value if "stride" in o.attributes else None
    sdim = (ir.IntegerAttr(o.attributes["stride_dimension"]).value
            if "stride_dimension" in o.attributes else None)

    def run(m, x, amount):
        x = np.asarray(x)
        if not stride:
            return (np.roll(x, int(amount), axis=d),)
        parts = [np.roll(np.take(x, [k], axis=sdim), int(amount) + k * stride, axis=d)
                 for k in range(x.shape[sdim])]
        return (np.concatenate(parts, axis=sdim),)

    return run


@op("tpu.dynamic_gather")
def _dynamic_gather(o, cc):
    # result[..., i, ...] = source[..., indices[..., i, ...], ...] along the one gathered
    # dimension; the other dimensions pair up element for element. The gathered dimension
    # is at most one vreg long, and the hardware reads only the index bits it needs: an
    # index outside [0, n) wraps (the lowering masks what take_along_axis's modes ask).
    dims = i64s(o.attributes["dimensions"])
    if len(dims) != 1:
        raise ExecutorError(f"tpu.dynamic_gather over dimensions {dims}: only one is supported")
    d = dims[0]

    def run(m, src, idx):
        src = np.asarray(src)
        idx = np.mod(np.asarray(idx).astype(np.int64), src.shape[d])
        return (np.take_along_axis(src, idx, axis=d),)

    return run


@op("tpu.stochastic_convert")
def _stochastic_convert(o, cc):
    # f32 -> a narrower float, rounded at random: the random bits are added to the
    # mantissa bits the narrowing drops, then those bits are cleared (a round toward zero
    # of the sum); NaN and infinities convert as they are.
    dt, _ = elem_and_shape(o.result.type)
    if dt != np.dtype(ml_dtypes.bfloat16):
        raise ExecutorError(f"tpu.stochastic_convert to {dt}: only bf16 is modelled")
    drop = 23 - int(ml_dtypes.finfo(dt).nmant)
    mask = np.uint32((1 << drop) - 1)

    def run(m, x, bits):
        x = np.asarray(x, np.float32)
        u = x.view(np.uint32)
        noisy = ((u + (np.asarray(bits).view(np.uint32) & mask)) & ~mask).view(np.float32)
        return (np.where(np.isfinite(x), noisy, x).astype(dt),)

    return run


def _sub_word(t: ir.Type) -> tuple[int, np.dtype | None]:
    """(bits, float dtype or None) of the packed element type ``t`` (``i2``/``i4``/``i8``/
    ``i16``, ``bf16``, ``f8...``)."""
    s = str(t)
    if s.startswith("i") and s[1:].isdigit():
        return int(s[1:]), None
    dt = np_dtype(t)
    return bits(dt), dt


def _low_bits(x, n: int) -> np.ndarray:
    """The low ``n`` bits of integers ``x`` as non-negative int64."""
    return np.asarray(x).astype(np.int64) & ((1 << n) - 1)


def _signed(u: np.ndarray, n: int) -> np.ndarray:
    """``n``-bit patterns ``u`` (non-negative int64) read as two's complement."""
    return np.where(u >= (1 << (n - 1)), u - (1 << n), u)


@op("tpu.pack_elementwise")
def _pack_elementwise(o, cc):
    # Each source converted to the target type; source i in bits [i * n, (i + 1) * n) of
    # the result word (ints truncated, floats rounded to nearest even).
    rdt, _ = elem_and_shape(o.result.type)
    n, fdt = _sub_word(ir.TypeAttr(o.attributes["target_type"]).value)
    width = bits(rdt)

    def run(m, *xs):
        acc = np.zeros(np.shape(xs[0]), np.int64)
        for i, x in enumerate(xs):
            if fdt is not None:
                part = _low_bits(np.asarray(x).astype(fdt).view(unsigned(fdt)), n)
            else:
                part = _low_bits(x, n)
            acc |= part << (i * n)
        return (_signed(acc, width).astype(rdt),)

    return run


@op("tpu.unpack_elementwise")
def _unpack_elementwise(o, cc):
    # Sub-element ``index`` of each word, of the source type, converted to the result's
    # (ints sign-extended).
    rdt, _ = elem_and_shape(o.result.type)
    n, fdt = _sub_word(ir.TypeAttr(o.attributes["source_type"]).value)
    index = ir.IntegerAttr(o.attributes["index"]).value

    def run(m, x):
        part = _low_bits(np.asarray(x).astype(np.int64) >> (index * n), n)
        if fdt is not None:
            val = part.astype(unsigned(fdt)).view(fdt)
        else:
            val = _signed(part, n)
        return (val.astype(rdt),)

    return run


def _strided(ref, idx, strides, shape):
    sl = tuple(slice(int(i), int(i) + n * s, s) for i, n, s in zip(idx, shape, strides))
    return ref[sl]


@op("tpu.strided_load")
def _strided_load(o, cc):
    strides = i64s(o.attributes["strides"])
    _, shape = elem_and_shape(o.result.type)
    return lambda m, ref, *idx: (_strided(ref, idx, strides, shape).copy(),)


@op("tpu.strided_store")
def _strided_store(o, cc):
    strides = i64s(o.attributes["strides"])

    def run(m, val, ref, *idx):
        _strided(ref, idx, strides, np.shape(val))[...] = val

    return run


@op("tpu.vector_store")
def _vector_store(o, cc):
    strides = i64s(o.attributes["strides"]) if "strides" in o.attributes else []
    seg = o.operation.attributes["operandSegmentSizes"]
    n_idx, has_mask = int(seg[2]), int(seg[3]) if len(seg) > 3 else 0
    add = "add" in o.attributes and bool(ir.BoolAttr(o.attributes["add"]).value)

    def run(m, val, ref, *rest):
        idx, mask = rest[:n_idx], (rest[n_idx] if has_mask else None)
        val = np.asarray(val)
        view = (_strided(ref, idx, strides, val.shape) if strides
                else window(ref, idx, val.shape))
        new = view + val if add else val
        view[...] = new if mask is None else np.where(mask, new, view)

    return run


_DN = re.compile(r"<\[([\d, ]*)\], \[([\d, ]*)\], \[([\d, ]*)\], \[([\d, ]*)\], "
                 r"\[([\d, ]*)\], \[([\d, ]*)\], \[([\d, ]*)\]>")


def _ints(s):
    return [int(v) for v in s.split(",") if v.strip()]


@op("tpu.matmul")
def _matmul(o, cc):
    dt, _ = elem_and_shape(o.result.type)
    if "dimension_numbers" in o.attributes:
        m = _DN.search(str(o.attributes["dimension_numbers"]))
        lc, rc, lnc, rnc, order, lb, rb = (_ints(g) for g in m.groups())
    else:
        lc, rc, lnc, rnc, order, lb, rb = [1], [0], [0], [1], [0, 0, 1, 1], [], []
    natural = [(0, d) for d in lb] + [(0, d) for d in lnc] + [(1, d) for d in rnc]
    perm = [natural.index(p) for p in zip(order[::2], order[1::2])]
    tl = "transpose_lhs" in o.attributes and bool(ir.BoolAttr(o.attributes["transpose_lhs"]).value)
    tr = "transpose_rhs" in o.attributes and bool(ir.BoolAttr(o.attributes["transpose_rhs"]).value)

    def run(m, lhs, rhs, acc):
        lhs, rhs = np.asarray(lhs), np.asarray(rhs)
        if tl:
            lhs = np.swapaxes(lhs, -1, -2)
        if tr:
            rhs = np.swapaxes(rhs, -1, -2)
        wide = np.int64 if dt.kind in "iu" else np.float32
        a = np.transpose(lhs.astype(wide), lb + lnc + lc)
        b = np.transpose(rhs.astype(wide), rb + rc + rnc)
        nb = len(lb)
        bshape = a.shape[:nb]
        m_shape, k_shape = a.shape[nb:nb + len(lnc)], a.shape[nb + len(lnc):]
        n_shape = b.shape[nb + len(rc):]
        k = int(np.prod(k_shape))
        a, b = a.reshape(bshape + (-1, k)), b.reshape(bshape + (k, -1))
        r = a @ b if wide is np.int64 else host_xla.matmul(a, b)
        r = np.transpose(r.reshape(bshape + m_shape + n_shape), perm)
        return ((r + np.asarray(acc).astype(wide)).astype(dt),)

    return run


@op("tpu.memref_slice")
def _memref_slice(o, cc):
    _, shape = elem_and_shape(o.result.type)
    n_base = len(elem_and_shape(o.operands[0].type)[1])

    dynamic = [k for k, n in enumerate(shape) if ir.ShapedType.is_dynamic_size(n)]

    def run(m, ref, *idx):
        base, sizes = idx[:n_base], list(shape)
        for k, n in zip(dynamic, idx[n_base:]):  # dims of run-time size
            sizes[k] = int(n)
        return (ref[tuple(slice(int(i), int(i) + n) for i, n in zip(base, sizes))],)

    return run


@op("tpu.memref_squeeze", "tpu.memref_reshape", "tpu.reinterpret_cast")
def _memref_reshape(o, cc):
    _, shape = elem_and_shape(o.result.type)

    def run(m, ref):
        v = ref.reshape(shape)
        if isinstance(ref, DerivedRef):
            return (v,)
        if not np.shares_memory(v, ref) and ref.size:
            raise ExecutorError(f"{o.operation.name} of a non-contiguous view")
        return (v,)

    return run


@op("tpu.memref_bitcast")
def _memref_bitcast(o, cc):
    dt, _ = elem_and_shape(o.result.type)
    return lambda m, ref: (bitcast(ref, dt),)


@op("tpu.bitcast")
def _vector_bitcast(o, cc):
    """A vector's bits as another element type. Between widths the second-minor dim
    changes as a memref bitcast's does: ``k`` consecutive narrow rows pack into one wide
    row, the first in the low bits (:func:`~pallas_tpu._src.executor.derived.pack`)."""
    dt, _ = elem_and_shape(o.result.type)
    src, _ = elem_and_shape(o.operands[0].type)
    # int4 counts 4 bits, two to a byte (derived.pack/unpack work on bit patterns).
    if bits(src) == bits(dt):
        return lambda m, x: (np.array(bitcast(np.ascontiguousarray(x), dt)),)
    if bits(src) > bits(dt):
        return lambda m, x: (unpack(np.asarray(x), dt),)
    return lambda m, x: (pack(np.asarray(x), dt),)


@op("tpu.sem_signal")
def _sem_signal(o, cc):
    def run(m, sem, amount, *rest):
        sem[...] = sem + amount

    return run


@op("tpu.sem_wait")
def _sem_wait(o, cc):
    def run(m, sem, amount):
        if int(sem) < int(amount):
            raise ExecutorError(
                f"tpu.sem_wait for {int(amount)} on a semaphore holding {int(sem)}: it "
                f"would block forever (nothing else runs on this core)")
        sem[...] = sem - amount

    return run


@op("tpu.sem_read")
def _sem_read(o, cc):
    return lambda m, sem: (np.asarray(sem, np.int32).copy(),)


@op("tpu.enqueue_dma")
def _enqueue_dma(o, cc):
    seg = [int(v) for v in o.operation.attributes["operandSegmentSizes"]]

    def run(m, *vals):
        it = iter(vals)
        groups = [[next(it) for _ in range(n)] for n in seg]
        src, src_sem, dst, dst_sem = groups[0][0], groups[1], groups[2][0], groups[3][0]
        # The data as it is when the DMA starts (it lands at the wait); a read-only
        # source (an XLA operand) cannot change meanwhile, so it is not copied.
        fixed = isinstance(src, np.ndarray) and not src.flags.writeable
        data = src if fixed else np.array(src)
        m.start_dma(data, dst, dst_sem, src_sem[0] if src_sem else None)

    return run


@op("tpu.wait_dma2", "tpu.wait_dma")
def _wait_dma(o, cc):
    name = o.operation.name

    def run(m, sem, *refs):
        m.wait_dma(sem, refs[1] if name == "tpu.wait_dma2" else None)

    return run


@op("tpu.sem_alloc")
def _sem_alloc(o, cc):
    # An array of semaphores (SemaphoreType.REGULAR((m, n))) has the memref's shape.
    shape = tuple(ir.MemRefType(o.result.type).shape)
    return lambda m: (np.zeros(shape, np.int32),)


# The hardware PRNG, as the model of pallas_tpu._src.prng_model (what TPU interpret mode
# computes for the same seeds), not the chip's generator.


@op("tpu.prng_set_seed_32")
def _prng_set_seed(o, cc):
    def run(m, *seeds):
        m.prng = [[int(np.asarray(s)) for s in seeds], 0]
        return ()

    return run


@op("tpu.prng_random_bits")
def _prng_random_bits(o, cc):
    _dt, shape = elem_and_shape(o.result.type)

    def run(m, *_):
        if m.prng is None:
            raise ExecutorError("tpu.prng_random_bits before tpu.prng_set_seed_32: the "
                                "kernel draws from its PRNG without seeding it")
        seeds, n = m.prng
        m.prng[1] = n + 1
        return (prng_model.host_draw(seeds, n, shape),)

    return run
