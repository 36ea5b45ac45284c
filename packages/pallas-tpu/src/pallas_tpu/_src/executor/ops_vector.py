"""``vector`` and ``memref`` ops. Memrefs are writable numpy views; vectors are arrays."""

from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir

from pallas.executor import ExecutorError, elem_and_shape
from pallas.executor import int_array_attr as i64s
from pallas_tpu._src.executor.engine import op


def window(ref, idx, shape):
    """The view of ``ref`` at indices ``idx`` of a vector of ``shape`` (its trailing dims);
    an access past the end is an error (Mosaic's bounds checks)."""
    idx = [int(i) for i in idx]
    lead = len(idx) - len(shape)
    sl = tuple(idx[:lead]) + tuple(slice(i, i + n) for i, n in zip(idx[lead:], shape))
    for d, (i, n) in enumerate(zip(idx[lead:], shape)):
        if i < 0 or i + n > ref.shape[lead + d]:
            raise ExecutorError(f"out-of-bounds access: [{i}, {i + n}) of dim {lead + d} of "
                                f"a memref of shape {ref.shape}")
    return ref[sl]


@op("vector.load")
def _load(o, cc):
    _, shape = elem_and_shape(o.result.type)
    return lambda m, ref, *idx: (window(ref, idx, shape).copy(),)


@op("vector.store")
def _store(o, cc):
    def run(m, val, ref, *idx):
        window(ref, idx, np.shape(val))[...] = val

    return run


@op("memref.load")
def _mload(o, cc):
    return lambda m, ref, *idx: (ref[tuple(int(i) for i in idx)].copy(),)


@op("memref.store")
def _mstore(o, cc):
    def run(m, val, ref, *idx):
        ref[tuple(int(i) for i in idx)] = val

    return run


@op("memref.alloca", "memref.alloc")
def _alloca(o, cc):
    dt, shape = elem_and_shape(o.result.type)
    return lambda m: (np.zeros(shape, dt),)


@op("vector.broadcast")
def _broadcast(o, cc):
    _, shape = elem_and_shape(o.result.type)
    return lambda m, x: (np.broadcast_to(x, shape),)


@op("vector.shape_cast")
def _shape_cast(o, cc):
    _, shape = elem_and_shape(o.result.type)
    return lambda m, x: (np.reshape(x, shape),)


@op("vector.extract")
def _extract(o, cc):
    static = i64s(o.attributes["static_position"])
    dyn = ir.ShapedType.get_dynamic_size() if hasattr(ir.ShapedType, "get_dynamic_size") \
        else -9223372036854775808

    def run(m, x, *d):
        it = iter(d)
        pos = tuple(int(next(it)) if p == dyn else p for p in static)
        return (np.asarray(x[pos]).copy(),)

    return run


@op("vector.extract_strided_slice")
def _ess(o, cc):
    offs, sizes = i64s(o.attributes["offsets"]), i64s(o.attributes["sizes"])
    strides = i64s(o.attributes["strides"])
    sl = tuple(slice(a, a + n * s, s) for a, n, s in zip(offs, sizes, strides))
    return lambda m, x: (x[sl],)


_KINDS = {
    "add": np.add, "mul": np.multiply, "maxsi": np.maximum, "minsi": np.minimum,
    "maximumf": np.maximum, "minimumf": np.minimum, "maxnumf": np.fmax,
    "minnumf": np.fmin, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}


def kind_of(attr) -> str:
    return str(attr).split("<")[-1].rstrip(">")


@op("vector.multi_reduction")
def _multi_reduction(o, cc):
    kind = kind_of(o.attributes["kind"])
    axes = tuple(i64s(o.attributes["reduction_dims"]))
    dt, _ = elem_and_shape(o.result.type)
    if kind in ("maxui", "minui"):
        f = np.maximum if kind == "maxui" else np.minimum

        def run(m, x, acc):
            x, acc = np.asarray(x), np.asarray(acc)
            u = x.view(np.dtype(f"u{x.dtype.itemsize}"))
            r = f(f.reduce(u, axis=axes), acc.view(u.dtype))
            return (np.asarray(r).view(dt),)

        return run
    if kind not in _KINDS:
        raise ExecutorError(f"the Mosaic executor does not know reduction kind {kind!r}")
    f = _KINDS[kind]

    def run(m, x, acc):
        x = np.asarray(x)
        wide = x.astype(np.float32) if x.dtype.kind == "f" and x.dtype.itemsize < 4 else x
        r = f.reduce(wide, axis=axes)
        return (np.asarray(f(r, acc)).astype(dt),)

    return run


__all__ = ["ExecutorError", "i64s", "window"]
