"""``vector`` ops on register values (loads and stores are in :mod:`ops_memref`)."""

from __future__ import annotations

import numpy as np

from pallas_mosaic_gpu._src.executor import subbyte
from pallas_mosaic_gpu._src.executor.engine import int_array_attr, op
from pallas_mosaic_gpu._src.executor.memref import DYNAMIC
from pallas_mosaic_gpu._src.executor.types import EmulationUnsupported, dtype_of, vshape


def _lanes(*xs) -> int:
    return max(np.asarray(x).shape[0] for x in xs)


def _inserted(x, v, index) -> tuple:
    """The result of writing ``x`` into the vector ``v`` at ``index`` (of each thread's
    vector), as a new value with as many lanes as the wider of the two."""
    x, v = np.asarray(x), np.asarray(v)
    out = np.array(np.broadcast_to(v, (_lanes(x, v),) + v.shape[1:]))
    out[(slice(None),) + index] = x
    return (out,)


@op("vector.broadcast", "vector.splat")
def _broadcast(o, cc):
    shape = vshape(o.results[0].type)

    def run(m, x):
        x = np.asarray(x)
        k = len(shape) - (x.ndim - 1)
        x = x.reshape((x.shape[0],) + (1,) * k + x.shape[1:])
        return (np.broadcast_to(x, (x.shape[0],) + shape),)

    return run


@op("vector.from_elements")
def _from_elements(o, cc):
    shape = vshape(o.results[0].type)
    dt = dtype_of(o.results[0].type)

    def run(m, *xs):
        n = _lanes(*xs)
        v = np.stack([np.broadcast_to(np.asarray(x, dt), (n,)) for x in xs], -1)
        return (v.reshape((n,) + shape),)

    return run


def _positions(o, dyn):
    static = int_array_attr(o.attributes["static_position"])
    dyn = iter(dyn)
    pos = []
    for p in static:
        if p == DYNAMIC:
            d = np.asarray(next(dyn)).reshape(-1)
            if not (d == d[0]).all():
                raise EmulationUnsupported("vector.extract/insert at per-thread positions")
            pos.append(int(d[0]))
        else:
            pos.append(p)
    return tuple(pos)


@op("vector.extract")
def _extract(o, cc):
    def run(m, v, *dyn):
        pos = _positions(o, dyn)
        return (np.asarray(v)[(slice(None),) + pos],)

    return run


@op("vector.insert")
def _insert(o, cc):
    def run(m, x, v, *dyn):
        return _inserted(x, v, _positions(o, dyn))

    return run


@op("vector.extract_strided_slice")
def _extract_strided_slice(o, cc):
    offs = int_array_attr(o.attributes["offsets"])
    sizes = int_array_attr(o.attributes["sizes"])
    steps = int_array_attr(o.attributes["strides"])
    sl = tuple(slice(a, a + n * s, s) for a, n, s in zip(offs, sizes, steps))

    def run(m, v):
        return (np.asarray(v)[(slice(None),) + sl],)

    return run


@op("vector.insert_strided_slice")
def _insert_strided_slice(o, cc):
    offs = int_array_attr(o.attributes["offsets"])
    steps = int_array_attr(o.attributes["strides"])

    def run(m, x, v):
        x, v = np.asarray(x), np.asarray(v)
        lead = v.ndim - x.ndim
        sl = tuple(offs[:lead]) + tuple(
            slice(a, a + k * s, s) for a, k, s in zip(offs[lead:], x.shape[1:], steps))
        return _inserted(x, v, sl)

    return run


@op("vector.bitcast")
def _bitcast(o, cc):
    shape = vshape(o.results[0].type)
    dt = dtype_of(o.results[0].type)

    def run(m, v):
        return (subbyte.bitcast(v, dt, shape),)

    return run


@op("vector.shape_cast")
def _shape_cast(o, cc):
    shape = vshape(o.results[0].type)

    def run(m, v):
        v = np.asarray(v)
        return (v.reshape((v.shape[0],) + shape),)

    return run


@op("vector.fma")
def _fma(o, cc):
    def run(m, a, b, c):
        return (np.asarray(a) * b + c,)

    return run


@op("vector.shuffle")
def _shuffle(o, cc):
    """Elements of ``v1 ++ v2`` (both rank 1, or along their leading dim) at ``mask``."""
    mask = int_array_attr(o.attributes["mask"])

    def run(m, a, b):
        a, b = np.asarray(a), np.asarray(b)
        n = _lanes(a, b)
        both = np.concatenate([np.broadcast_to(a, (n,) + a.shape[1:]),
                               np.broadcast_to(b, (n,) + b.shape[1:])], axis=1)
        return (both[:, mask],)

    return run


@op("llvm.insertelement", "llvm.extractelement")
def _llvm_element(o, cc):
    """LLVM's dynamic-position insert into / extract from a rank-1 vector."""
    insert = o.name == "llvm.insertelement"

    def pos(p):
        p = np.asarray(p).reshape(-1)
        if not (p == p[0]).all():
            raise EmulationUnsupported(f"{o.name} at per-thread positions")
        return int(p[0])

    def run_insert(m, v, x, p):
        return _inserted(np.asarray(x).reshape(-1), v, (pos(p),))

    def run_extract(m, v, p):
        return (np.asarray(v)[:, pos(p)],)

    return run_insert if insert else run_extract
