"""``memref`` ops (views, casts, loads/stores, per-thread allocas) and ``vector``
loads/stores over the flat memory."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor import subbyte
from pallas_mosaic_gpu._src.executor.engine import int_array_attr, op
from pallas_mosaic_gpu._src.executor.memref import (
    MemRef,
    contiguous_strides,
    elem_bytes,
    mixed,
)
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported, dtype_of, vshape


def _segments(o, n: int) -> list[list]:
    sizes = int_array_attr(o.attributes["operandSegmentSizes"])
    out, i = [], 0
    for s in sizes[:n]:
        out.append(list(range(i, i + s)))
        i += s
    return out


def _i64(x) -> np.ndarray:
    return np.asarray(x, np.int64).reshape(-1)


@op("memref.reinterpret_cast")
def _reinterpret_cast(o, cc):
    a = o.attributes
    seg = _segments(o, 4)

    def run(m, *xs):
        src = xs[0]
        offs = mixed(int_array_attr(a["static_offsets"]), [_i64(xs[i]) for i in seg[1]])
        sizes = mixed(int_array_attr(a["static_sizes"]), [_i64(xs[i]) for i in seg[2]])
        strides = mixed(int_array_attr(a["static_strides"]), [_i64(xs[i]) for i in seg[3]])
        return (MemRef(src.allocated, src.aligned, offs[0], sizes, strides, src.dtype),)

    return run


@op("memref.extract_strided_metadata")
def _extract_strided_metadata(o, cc):
    def run(m, src):
        base = MemRef(src.allocated, src.aligned, np.zeros(1, np.int64), [], [], src.dtype)
        return (base, src.offset, *src.sizes, *src.strides)

    return run


@op("memref.extract_aligned_pointer_as_index")
def _extract_aligned_pointer(o, cc):
    def run(m, src):
        return (np.asarray(src.aligned, np.int64),)

    return run


@op("memref.view")
def _view(o, cc):
    t = ir.MemRefType(o.results[0].type)
    dt = dtype_of(t)

    def run(m, src, shift, *dyn):
        shape = mixed(list(t.shape), [_i64(d) for d in dyn])
        static = [int(s[0]) for s in shape]
        strides = [np.asarray([s], np.int64) for s in contiguous_strides(static)]
        aligned = np.asarray(src.aligned, np.int64) + np.asarray(src.offset, np.int64) * \
            elem_bytes(src.dtype) + _i64(shift)
        return (MemRef(src.allocated, aligned, np.zeros(1, np.int64), shape, strides, dt),)

    return run


@op("memref.collapse_shape")
def _collapse_shape(o, cc):
    groups = [[int(ir.IntegerAttr(i).value) for i in ir.ArrayAttr(g)]
              for g in ir.ArrayAttr(o.attributes["reassociation"])]

    def run(m, src):
        sizes, strides = [], []
        for g in groups:
            n = np.ones(1, np.int64)
            for d in g:
                n = n * src.sizes[d]
            sizes.append(n)
            strides.append(src.strides[g[-1]] if g else np.ones(1, np.int64))
        return (MemRef(src.allocated, src.aligned, src.offset, sizes, strides, src.dtype),)

    return run


@op("memref.expand_shape")
def _expand_shape(o, cc):
    t = ir.MemRefType(o.results[0].type)
    groups = [[int(ir.IntegerAttr(i).value) for i in ir.ArrayAttr(g)]
              for g in ir.ArrayAttr(o.attributes["reassociation"])]

    def run(m, src, *dyn):
        if dyn:
            raise EmulationUnsupported("memref.expand_shape with dynamic sizes")
        sizes, strides = [None] * len(t.shape), [None] * len(t.shape)
        for g, st in zip(groups, src.strides):
            acc = np.asarray(st, np.int64)
            for d in reversed(g):
                sizes[d] = np.asarray([t.shape[d]], np.int64)
                strides[d] = acc
                acc = acc * t.shape[d]
        return (MemRef(src.allocated, src.aligned, src.offset, sizes, strides, src.dtype),)

    return run


@op("memref.transpose")
def _transpose(o, cc):
    amap = ir.AffineMapAttr(o.attributes["permutation"]).value
    perm = [ir.AffineDimExpr(e).position for e in amap.results]

    def run(m, src):
        return (MemRef(src.allocated, src.aligned, src.offset, [src.sizes[p] for p in perm],
                       [src.strides[p] for p in perm], src.dtype),)

    return run


@op("memref.subview")
def _subview(o, cc):
    a = o.attributes
    seg = _segments(o, 4)
    rshape = list(ir.MemRefType(o.results[0].type).shape)

    def run(m, *xs):
        src = xs[0]
        offs = mixed(int_array_attr(a["static_offsets"]), [_i64(xs[i]) for i in seg[1]])
        sizes = mixed(int_array_attr(a["static_sizes"]), [_i64(xs[i]) for i in seg[2]])
        steps = mixed(int_array_attr(a["static_strides"]), [_i64(xs[i]) for i in seg[3]])
        offset = src.element_offsets(offs)
        strides = [st * s for st, s in zip(src.strides, steps)]
        keep, drop = [], len(sizes) - len(rshape)
        for d, n in enumerate(sizes):  # rank-reducing: drop the first unit dims
            if drop and int(n[0]) == 1:
                drop -= 1
                continue
            keep.append(d)
        return (MemRef(src.allocated, src.aligned, offset, [sizes[d] for d in keep],
                       [strides[d] for d in keep], src.dtype),)

    return run


@op("memref.cast")
def _cast(o, cc):
    def run(m, src):
        return (src,)

    return run


@op("memref.alloca")
def _alloca(o, cc):
    t = ir.MemRefType(o.results[0].type)
    dt = dtype_of(t)
    if any(s < 0 for s in t.shape) or list(o.operands):
        raise EmulationUnsupported("memref.alloca of a dynamic shape")
    n = int(np.prod(t.shape)) * elem_bytes(dt)

    def run(m):
        # Each thread has its own: one region, a slice per thread.
        lanes = m.threads
        base = m.memory.alloc(max(n, 1) * lanes, "memref.alloca", fill=0xFF)
        ptr = base + np.arange(lanes, dtype=np.int64) * max(n, 1)
        strides = [np.asarray([s], np.int64) for s in contiguous_strides(t.shape)]
        sizes = [np.asarray([s], np.int64) for s in t.shape]
        return (MemRef(ptr, ptr, np.zeros(1, np.int64), sizes, strides, dt),)

    return run


@op("memref.load")
def _load(o, cc):
    def run(m, ref, *idx):
        if subbyte.is_int4(ref.dtype):  # the byte holding it, then its nibble
            e = ref.element_offsets(idx)
            data = m.memory.gather(np.asarray(ref.aligned, np.int64) + e // 2, np.uint8,
                                   m.mask)
            pair = subbyte.unpack(np.asarray(data).reshape(-1, 1), ref.dtype)
            return (np.take_along_axis(pair, (e % 2).reshape(-1, 1), 1)[:, 0],)
        return (m.memory.gather(ref.address(idx), ref.dtype, m.mask),)

    return run


@op("memref.store")
def _store(o, cc):
    def run(m, v, ref, *idx):
        m.memory.scatter(ref.address(idx), np.asarray(v, ref.dtype), m.mask)

    return run


def _lane_mask(mask, ndim):
    return None if mask is None else mask.reshape((-1,) + (1,) * ndim)


@op("vector.load")
def _vector_load(o, cc):
    shape = vshape(o.results[0].type)

    def run(m, ref, *idx):
        addrs = ref.vector_addresses(idx, shape)
        return (m.memory.gather(addrs, ref.dtype, _lane_mask(m.mask, len(shape))),)

    return run


@op("vector.store")
def _vector_store(o, cc):
    shape = vshape(o.operands[0].type)

    def run(m, v, ref, *idx):
        addrs = ref.vector_addresses(idx, shape)
        m.memory.scatter(addrs, np.asarray(v, ref.dtype), _lane_mask(m.mask, len(shape)))

    return run
