"""``tpu`` dialect ops: layout-free vector ops, strided/masked memory access, matmul,
semaphores and DMAs (the data of a DMA lands when it is waited for)."""

from __future__ import annotations

import re

import numpy as np
from jaxlib.mlir import ir

from pallas_tpu._src.executor.derived import DerivedRef, bitcast
from pallas_tpu._src.executor.engine import op
from pallas_tpu._src.executor.ops_vector import i64s, window
from pallas_tpu._src.executor.types import ExecutorError, elem_and_shape


@op("tpu.assume_multiple")
def _assume_multiple(o, cc):
    return lambda env, x: (x,)


@op("tpu.trace_start", "tpu.trace_stop")
def _trace(o, cc):
    # Profiler annotations (jax.named_scope): nothing to compute.
    return lambda env: ()


@op("tpu.iteration_bound")
def _iteration_bound(o, cc):
    d = ir.IntegerAttr(o.attributes["dim"]).value
    return lambda env: (np.int32(env[0].grid[d]),)


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
    return lambda env: (val,)


@op("tpu.transpose")
def _transpose(o, cc):
    perm = i64s(o.attributes["permutation"])
    return lambda env, x: (np.transpose(x, perm),)


@op("tpu.concatenate")
def _concatenate(o, cc):
    d = ir.IntegerAttr(o.attributes["dimension"]).value
    return lambda env, *xs: (np.concatenate(xs, axis=d),)


@op("tpu.dynamic_rotate")
def _dynamic_rotate(o, cc):
    d = ir.IntegerAttr(o.attributes["dimension"]).value
    stride = ir.IntegerAttr(o.attributes["stride"]).value if "stride" in o.attributes else None
    sdim = (ir.IntegerAttr(o.attributes["stride_dimension"]).value
            if "stride_dimension" in o.attributes else None)

    def run(env, x, amount):
        x = np.asarray(x)
        if not stride:
            return (np.roll(x, int(amount), axis=d),)
        parts = [np.roll(np.take(x, [k], axis=sdim), int(amount) + k * stride, axis=d)
                 for k in range(x.shape[sdim])]
        return (np.concatenate(parts, axis=sdim),)

    return run


def _strided(ref, idx, strides, shape):
    sl = tuple(slice(int(i), int(i) + n * s, s) for i, n, s in zip(idx, shape, strides))
    return ref[sl]


@op("tpu.strided_load")
def _strided_load(o, cc):
    strides = i64s(o.attributes["strides"])
    _, shape = elem_and_shape(o.result.type)
    return lambda env, ref, *idx: (_strided(ref, idx, strides, shape).copy(),)


@op("tpu.strided_store")
def _strided_store(o, cc):
    strides = i64s(o.attributes["strides"])

    def run(env, val, ref, *idx):
        _strided(ref, idx, strides, np.shape(val))[...] = val

    return run


@op("tpu.vector_store")
def _vector_store(o, cc):
    strides = i64s(o.attributes["strides"]) if "strides" in o.attributes else []
    seg = o.operation.attributes["operandSegmentSizes"]
    n_idx, has_mask = int(seg[2]), int(seg[3]) if len(seg) > 3 else 0
    add = "add" in o.attributes and bool(ir.BoolAttr(o.attributes["add"]).value)

    def run(env, val, ref, *rest):
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

    def run(env, lhs, rhs, acc):
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
        r = (a.reshape(bshape + (-1, k)) @ b.reshape(bshape + (k, -1)))
        r = np.transpose(r.reshape(bshape + m_shape + n_shape), perm)
        return ((r + np.asarray(acc).astype(wide)).astype(dt),)

    return run


@op("tpu.memref_slice")
def _memref_slice(o, cc):
    _, shape = elem_and_shape(o.result.type)
    n_base = len(elem_and_shape(o.operands[0].type)[1])

    def run(env, ref, *idx):
        base = idx[:n_base]
        return (ref[tuple(slice(int(i), int(i) + n) for i, n in zip(base, shape))],)

    return run


@op("tpu.memref_squeeze", "tpu.memref_reshape", "tpu.reinterpret_cast")
def _memref_reshape(o, cc):
    _, shape = elem_and_shape(o.result.type)

    def run(env, ref):
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
    return lambda env, ref: (bitcast(ref, dt),)


@op("tpu.sem_signal")
def _sem_signal(o, cc):
    def run(env, sem, amount, *rest):
        sem[...] = sem + amount

    return run


@op("tpu.sem_wait")
def _sem_wait(o, cc):
    def run(env, sem, amount):
        if int(sem) < int(amount):
            raise ExecutorError(
                f"tpu.sem_wait for {int(amount)} on a semaphore holding {int(sem)}: it "
                f"would block forever (nothing else runs on this core)")
        sem[...] = sem - amount

    return run


@op("tpu.sem_read")
def _sem_read(o, cc):
    return lambda env, sem: (np.asarray(sem, np.int32).copy(),)


@op("tpu.enqueue_dma")
def _enqueue_dma(o, cc):
    seg = [int(v) for v in o.operation.attributes["operandSegmentSizes"]]

    def run(env, *vals):
        it = iter(vals)
        groups = [[next(it) for _ in range(n)] for n in seg]
        src, src_sem, dst, dst_sem = groups[0][0], groups[1], groups[2][0], groups[3][0]
        env[0].start_dma(np.array(src), dst, dst_sem, src_sem[0] if src_sem else None)

    return run


@op("tpu.wait_dma2", "tpu.wait_dma")
def _wait_dma(o, cc):
    name = o.operation.name

    def run(env, sem, *refs):
        env[0].wait_dma(sem, refs[1] if name == "tpu.wait_dma2" else None)

    return run


@op("tpu.sem_alloc")
def _sem_alloc(o, cc):
    # An array of semaphores (SemaphoreType.REGULAR((m, n))) has the memref's shape.
    shape = tuple(ir.MemRefType(o.result.type).shape)
    return lambda env: (np.zeros(shape, np.int32),)
