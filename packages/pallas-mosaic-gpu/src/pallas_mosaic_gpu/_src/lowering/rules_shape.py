"""Lowering rules that change shapes: broadcasts, reshapes, iota and reductions.

Arrays use the strided layout (see :mod:`values`), in which an array is its elements in
row-major order spread over the warpgroup: a reshape is free, a broadcast of a scalar is
a splat, and a reduction over every axis is a warpgroup reduction. Reductions over some
axes only, and broadcasts that replicate an array along new axes, need a tiled layout
and are not lowered yet.
"""

from __future__ import annotations

import math

import jax.extend.core.primitives as P
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, scf, vector

from pallas_mosaic_gpu._src.lowering import small
from pallas_mosaic_gpu._src.lowering import values as V
from pallas_mosaic_gpu._src.lowering.engine import Lit, rule
from pallas_mosaic_gpu._src.lowering.register_layouts import full_layout, hinted_layout, is_tiled
from pallas_mosaic_gpu._src.lowering.spill import load_element, operand_memrefs
from pallas_mosaic_gpu._src.lowering.views import store_view


def _reshaped(x, shape):
    if isinstance(x.layout, fa.WGSplatFragLayout):
        return V.FragmentedArray.splat(x.registers.item(), tuple(shape),
                                       is_signed=x.is_signed)
    x = V.to_strided(x)
    layout = V.strided_layout(tuple(shape))  # the same size, hence the same vector width
    regs = np.empty(layout.registers_shape(tuple(shape)), dtype=object)
    regs.flat[:] = list(x.registers.flat)
    return V.FragmentedArray(_registers=regs, _layout=layout, _is_signed=x.is_signed)


@rule(P.broadcast_in_dim_p)
def _broadcast_in_dim(lctx, eqn, x):
    aval_in, out = eqn.invars[0].aval, eqn.outvars[0].aval
    shape = tuple(out.shape)
    if not aval_in.shape or isinstance(x, Lit) or (
            isinstance(x, V.FragmentedArray) and isinstance(x.layout, fa.WGSplatFragLayout)):
        value = V.scalar(x, aval_in) if not aval_in.shape else (
            V.array(x, aval_in).registers.item())
        if small.is_small(shape):
            return small.to_small(value, out.update(shape=()), shape)
        return V.splat(value, shape, out.dtype)
    dims = tuple(eqn.params["broadcast_dimensions"])
    if is_tiled(x):  # a row/column of a tiled array: registers repeated, no SMEM
        layout = full_layout(x.layout, shape, dims)
        if layout is None or tuple(aval_in.shape) != tuple(shape[d] for d in dims):
            raise NotImplementedError(
                f"broadcasting a {tuple(aval_in.shape)} array in the register layout "
                f"{x.layout} to {shape} along {dims} (a row or column of a WGMMA/TCGEN05 "
                "array broadcasts back to a 2D array of that layout)")
        return x.broadcast_in_dim(shape, dims, layout)

    def source_index(idx):
        return [0 if aval_in.shape[i] == 1 else idx[d] for i, d in enumerate(dims)]

    if isinstance(x, small.Small):
        return small.build(shape, out.dtype, lambda idx: small.element(x, source_index(idx)))
    if int(np.prod(aval_in.shape)) == int(np.prod(shape)):
        return _reshaped(x, shape)  # only size-1 axes are added
    (m,), spilled = operand_memrefs(lctx, eqn, [x])
    res = small.build(shape, out.dtype,
                      lambda idx: load_element(m, source_index(idx), aval_in.dtype))
    if spilled:
        mgpu.warpgroup_barrier()
    return res


def _index(i):
    return V.const(i, V.index()) if isinstance(i, int) else i


@rule(P.transpose_p)
def _transpose(lctx, eqn, x):
    perm = tuple(eqn.params["permutation"])
    out = eqn.outvars[0].aval

    def source_index(idx):
        src = [None] * len(perm)
        for o, p in enumerate(perm):
            src[p] = idx[o]
        return src

    if isinstance(x, small.Small):
        return small.build(out.shape, out.dtype,
                           lambda idx: small.element(x, source_index(idx)))
    if isinstance(x, V.FragmentedArray) and isinstance(x.layout, fa.WGSplatFragLayout):
        return V.splat(x.registers.item(), out.shape, out.dtype)
    (m,), spilled = operand_memrefs(lctx, eqn, [x])
    res = small.build(out.shape, out.dtype,
                      lambda idx: load_element(m, source_index(idx), out.dtype))
    if spilled:
        mgpu.warpgroup_barrier()
    return res


@rule(P.reshape_p, P.squeeze_p)
def _reshape(lctx, eqn, x, *dyn):
    out = eqn.outvars[0].aval
    if not out.shape:
        if isinstance(x, small.Small):
            return x.values.flat[0]
        return V.scalar(x, eqn.invars[0].aval) if not isinstance(x, V.FragmentedArray) \
            else _scalar_of(x)
    if isinstance(x, Lit):
        return V.array(x, out) if not small.is_small(out.shape) else small.to_small(
            x, eqn.invars[0].aval, out.shape)
    if isinstance(x, small.Small):
        return small.Small(x.values.reshape(tuple(out.shape)))
    return _reshaped(x, out.shape)


def _scalar_of(x):
    if isinstance(x.layout, fa.WGSplatFragLayout):
        return x.registers.item()
    raise NotImplementedError("extracting one element of a warpgroup array")


@rule(P.iota_p)
def _iota(lctx, eqn):
    out = eqn.outvars[0].aval
    dim = int(eqn.params["dimension"])
    ty, shape = V.elem_type(out.dtype), tuple(out.shape)
    hint = hinted_layout(lctx, eqn.outvars[0], shape)  # created in a cast's layout
    if isinstance(hint, fa.TiledLayout):
        try:
            return V.FragmentedArray.broadcasted_iota(ty, shape, dim, hint,
                                                      is_signed=V.signed(out.dtype))
        except (NotImplementedError, ValueError):
            pass  # a shape the layout does not tile: strided, like any other iota
    return V.FragmentedArray.broadcasted_iota(ty, shape, dim, V.strided_layout(shape),
                                              is_signed=V.signed(out.dtype))


def _combine(op_name, dtype):
    """The scalar combiner of a reduction (NaN-propagating max/min, as XLA)."""
    k = V.kind(dtype)
    return {
        "add": arith.addf if k == "f" else arith.addi,
        "prod": arith.mulf if k == "f" else arith.muli,
        "max": arith.maximumf if k == "f" else arith.maxsi if k == "i" else arith.maxui,
        "min": arith.minimumf if k == "f" else arith.minsi if k == "i" else arith.minui,
        "and": arith.andi, "or": arith.ori,
    }[op_name]


def _identity(op_name, dtype):
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)
    k = V.kind(dt)
    if op_name in ("add", "or"):
        return 0
    if op_name in ("prod", "and"):
        return 1
    if k == "f":
        return float("-inf") if op_name == "max" else float("inf")
    if k == "b":
        return 0 if op_name == "max" else 1
    info = jnp.iinfo(dt)
    return int(info.min) if op_name == "max" else int(info.max)


def _reduced_elements(lctx, eqn, x, axes, per_element):
    """Builds the output of a reduction (or arg-reduction) of ``x`` over ``axes``:
    ``per_element(read, count)`` combines the ``count`` elements that ``read(j)``
    (j an index ir.Value) returns for one output element."""
    aval, out = eqn.invars[0].aval, eqn.outvars[0].aval
    keep = [d for d in range(len(aval.shape)) if d not in axes]
    red_shape = [aval.shape[d] for d in axes]
    count = int(np.prod(red_shape))
    if isinstance(x, small.Small):
        m, spilled = None, False
    else:
        (m,), spilled = operand_memrefs(lctx, eqn, [x])

    def elem(idx):
        def read(j):
            src = [None] * len(aval.shape)
            for d, i in zip(keep, idx):
                src[d] = _index(i)
            rem = j
            for d, n in zip(reversed(axes), reversed(red_shape)):
                src[d] = arith.remui(rem, V.const(n, V.index()))
                rem = arith.divui(rem, V.const(n, V.index()))
            if m is None:
                return small.element(x, src)
            return load_element(m, src, aval.dtype)
        return per_element(read, count)

    res = small.build(tuple(out.shape), out.dtype, elem)
    if spilled:
        mgpu.warpgroup_barrier()
    return res


def _loop_reduce(read, count, init, combine):
    loop = scf.ForOp(V.const(0, V.index()), V.const(count, V.index()),
                     V.const(1, V.index()), [init])
    with ir.InsertionPoint(loop.body):
        scf.YieldOp([combine(loop.inner_iter_args[0], read(loop.induction_variable))])
    return loop.results[0]


def _reduce(op_name):
    def lower(lctx, eqn, x):
        aval = eqn.invars[0].aval
        axes = tuple(int(a) for a in eqn.params["axes"])
        if not aval.shape or not axes:
            return x
        if is_tiled(x) and len(axes) < len(aval.shape):
            # Within and across warps in registers (WGMMA rows: warp shuffles).
            if op_name not in ("add", "max", "min"):
                raise NotImplementedError(
                    f"reduce_{op_name} of an array in the register layout {x.layout}")
            return x.reduce(op_name, axes, scratch=lctx.reduction_scratch)
        full = sorted(axes) == list(range(len(aval.shape)))
        if not full or isinstance(x, small.Small) or aval.dtype != np.float32 or (
                op_name in ("and", "or")):
            combine = _combine(op_name, aval.dtype)
            et = V.elem_type(aval.dtype)
            return _reduced_elements(
                lctx, eqn, x, axes,
                lambda read, count: _loop_reduce(
                    read, count, V.const(_identity(op_name, aval.dtype), et), combine))
        arr = V.array(x, aval)
        if isinstance(arr.layout, fa.WGSplatFragLayout):
            arr = V.to_strided(arr)
        red = arr.reduce(op_name, axes, scratch=lctx.reduction_scratch)
        return _scalar_of_reduced(red)

    return lower


def _scalar_of_reduced(red):
    r = red.registers.flat[0]
    if isinstance(r.type, ir.VectorType):
        return vector.extract(r, [], [0])
    return r


rule(P.reduce_sum_p)(_reduce("add"))
rule(P.reduce_max_p)(_reduce("max"))
rule(P.reduce_min_p)(_reduce("min"))
rule(P.reduce_prod_p)(_reduce("prod"))
rule(P.reduce_and_p)(_reduce("and"))
rule(P.reduce_or_p)(_reduce("or"))


def _arg(is_max):
    def lower(lctx, eqn, x):
        aval, out = eqn.invars[0].aval, eqn.outvars[0].aval
        axes = tuple(int(a) for a in eqn.params["axes"])
        k = V.kind(aval.dtype)
        it = V.elem_type(out.dtype)

        def per_element(read, count):
            first = read(V.const(0, V.index()))
            loop = scf.ForOp(V.const(1, V.index()), V.const(count, V.index()),
                             V.const(1, V.index()), [first, V.const(0, V.index())])
            with ir.InsertionPoint(loop.body):
                best, where = loop.inner_iter_args
                j = loop.induction_variable
                v = read(j)
                if k == "f":  # NaN wins (the first one), as jnp.argmax/argmin
                    pred = arith.CmpFPredicate.OGT if is_max else arith.CmpFPredicate.OLT
                    better = arith.cmpf(pred, v, best)
                    nan = arith.andi(arith.cmpf(arith.CmpFPredicate.UNO, v, v),
                                     arith.cmpf(arith.CmpFPredicate.ORD, best, best))
                    better = arith.ori(better, nan)
                else:
                    s_ = k == "i"
                    pred = {(True, True): arith.CmpIPredicate.sgt,
                            (True, False): arith.CmpIPredicate.ugt,
                            (False, True): arith.CmpIPredicate.slt,
                            (False, False): arith.CmpIPredicate.ult}[(is_max, s_)]
                    better = arith.cmpi(pred, v, best)
                scf.YieldOp([arith.select(better, v, best), arith.select(better, j, where)])
            return arith.index_cast(it, loop.results[1])

        return _reduced_elements(lctx, eqn, x, axes, per_element)

    return lower


rule(P.argmax_p)(_arg(True))
rule(P.argmin_p)(_arg(False))


def _cumulative(op_name):
    def lower(lctx, eqn, x):
        aval, out = eqn.invars[0].aval, eqn.outvars[0].aval
        axis, reverse = int(eqn.params["axis"]), bool(eqn.params["reverse"])
        n = aval.shape[axis]
        combine = _combine(op_name, aval.dtype)
        init = V.const(_identity(op_name, aval.dtype), V.elem_type(aval.dtype))
        if isinstance(x, small.Small):
            m, spilled = None, False
        else:
            (m,), spilled = operand_memrefs(lctx, eqn, [x])

        def elem(idx):
            i = _index(idx[axis])
            # out[..., i, ...] combines x[..., j, ...] for j <= i (j >= i when reversed)
            lo, hi = (i, V.const(n, V.index())) if reverse else (
                V.const(0, V.index()), arith.addi(i, V.const(1, V.index())))
            loop = scf.ForOp(lo, hi, V.const(1, V.index()), [init])
            with ir.InsertionPoint(loop.body):
                src = [_index(k) for k in idx]
                src[axis] = loop.induction_variable
                v = small.element(x, src) if m is None else load_element(m, src, aval.dtype)
                scf.YieldOp([combine(loop.inner_iter_args[0], v)])
            return loop.results[0]

        res = small.build(tuple(out.shape), out.dtype, elem)
        if spilled:
            mgpu.warpgroup_barrier()
        return res

    return lower


rule(P.cumsum_p)(_cumulative("add"))
rule(P.cumprod_p)(_cumulative("prod"))
rule(P.cummax_p)(_cumulative("max"))
rule(P.cummin_p)(_cumulative("min"))


@rule(P.concatenate_p)
def _concatenate(lctx, eqn, *xs):
    """Each output element read from the operand its index falls in (operands in SMEM,
    or held whole by every thread)."""
    dim = int(eqn.params["dimension"])
    out = eqn.outvars[0].aval
    avals = [v.aval for v in eqn.invars]
    bufs = lctx.spill_buffers.get(id(eqn)) or [None] * len(xs)
    srcs, spilled = [], False
    for x, a, buf in zip(xs, avals, bufs):
        if isinstance(x, small.Small):
            srcs.append(("small", x))
        elif buf is not None:
            store_view(buf, x, a, "smem", sync=False)
            srcs.append(("smem", buf))
            spilled = True
        else:
            hit = lctx.loaded_from.get(id(x))
            if hit is None:
                raise NotImplementedError(f"concatenating a {tuple(a.shape)} value (internal)")
            srcs.append(("smem", hit[1]))
    if spilled:
        mgpu.warpgroup_barrier()
    offsets = np.cumsum([0] + [a.shape[dim] for a in avals]).tolist()

    def elem(idx):
        i = _index(idx[dim])
        value = None
        for (kind, src), a, lo in reversed(list(zip(srcs, avals, offsets))):
            local = [_index(k) for k in idx]
            local[dim] = arith.subi(i, V.const(lo, V.index()))
            if lo + a.shape[dim] - 1 < 0:
                continue
            # clamp so that reads outside this operand stay in bounds (then discarded)
            local[dim] = arith.minui(local[dim], V.const(a.shape[dim] - 1, V.index()))
            v = small.element(src, local) if kind == "small" else load_element(
                src, local, a.dtype)
            if value is None:
                value = v
            else:
                inside = arith.cmpi(arith.CmpIPredicate.ult, i,
                                    V.const(lo + a.shape[dim], V.index()))
                value = arith.select(inside, v, value)
        return value

    res = small.build(tuple(out.shape), out.dtype, elem)
    if spilled:
        mgpu.warpgroup_barrier()
    return res


def _contiguous_registers(x, starts, out_shape):
    """The registers of ``x[starts : starts + out_shape]`` when that window is one
    contiguous run of ``x``'s strided layout that starts and ends on register
    boundaries with the same vector width (say, whole rows of a row-major array);
    None otherwise."""
    shape = tuple(x.shape)
    d = next((i for i, (n, m) in enumerate(zip(shape, out_shape)) if n != m), len(shape))
    # Dims before the first partial one must be single elements (or the window is not
    # contiguous); the partial one may be any range, later ones must be whole.
    if d < len(shape) and any(n != m for n, m in zip(shape[d + 1:], out_shape[d + 1:])):
        return None
    if any(m != 1 for m in out_shape[:d]) and d < len(shape):
        return None
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    off = sum(s * st for s, st in zip(starts, strides))
    size = math.prod(out_shape)
    x = V.to_strided(x)
    vec = x.layout.vec_size
    chunk = V.WARPGROUP_SIZE * vec
    try:
        out_layout = V.strided_layout(tuple(out_shape))
    except NotImplementedError:
        return None
    if out_layout.vec_size != vec or off % chunk or size % chunk:
        return None
    regs = np.empty(out_layout.registers_shape(tuple(out_shape)), dtype=object)
    regs.flat[:] = list(x.registers.flat)[off // chunk:(off + size) // chunk]
    return V.FragmentedArray(_registers=regs, _layout=out_layout, _is_signed=x.is_signed)


@rule(P.slice_p)
def _slice(lctx, eqn, x):
    """``lax.slice`` (``x[a:b, c:d]`` of a value): tile-aligned windows of an array in a
    tiled layout (say, an epilogue tile of a WGMMA accumulator) and contiguous runs of
    a strided one keep their registers; splats, small arrays and literals are rebuilt.
    Other windows would need an exchange through SMEM and are refused."""
    aval, out = eqn.invars[0].aval, eqn.outvars[0].aval
    starts = tuple(int(s) for s in eqn.params["start_indices"])
    limits = tuple(int(s) for s in eqn.params["limit_indices"])
    steps = tuple(int(s) for s in (eqn.params["strides"] or (1,) * len(starts)))
    window = tuple(slice(s, e, st) for s, e, st in zip(starts, limits, steps))
    shape = tuple(out.shape)
    if isinstance(x, Lit):
        return Lit(np.asarray(x.val)[window] if np.ndim(x.val) else x.val, out)
    if isinstance(x, small.Small):
        return small.build(shape, out.dtype, lambda idx: small.element(
            x, [s + i * st for s, i, st in zip(starts, idx, steps)]))
    if isinstance(x.layout, fa.WGSplatFragLayout):
        value = x.registers.item()
        return small.to_small(value, out.update(shape=()), shape) if small.is_small(shape) \
            else V.splat(value, shape, out.dtype)
    if small.is_small(shape):
        raise NotImplementedError(
            f"slicing {shape} out of a warpgroup array of shape {tuple(aval.shape)} (a "
            "result whose size is not a multiple of 128 would have to gather across "
            "threads)")
    if all(st == 1 for st in steps):
        if isinstance(x.layout, fa.TiledLayout):
            try:
                return x[tuple(slice(s, e) for s, e in zip(starts, limits))]
            except ValueError:
                pass  # not aligned to the layout's tiles: try the strided layout
        got = _contiguous_registers(x, starts, shape)
        if got is not None:
            return got
    raise NotImplementedError(
        f"slicing [{', '.join(f'{s}:{e}' + (f':{st}' if st != 1 else '') for s, e, st in zip(starts, limits, steps))}] "
        f"out of a {tuple(aval.shape)} array (lowered: windows aligned to the tiles of a "
        "WGMMA-layout array, e.g. an accumulator's epilogue tiles, and runs of whole rows "
        "of a strided one)")
