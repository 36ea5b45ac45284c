"""Reads and writes of refs: ``ref[...]``, ``pl.ds`` slices, masks, edge blocks.

A pointer-backed ref becomes ``base + sum(index_d * stride_d)`` over the array
dimensions, where ``index_d`` is the block's start (from the BlockSpec's index map)
plus the position inside the block; dimensions that can leave the array (edge blocks,
``Element`` padding, ``BoundedSlice``) add a mask. A register-backed ref (scratch) is a
variable that is read and reassigned whole.
"""

from __future__ import annotations

import dataclasses

import jax

from pallas_triton._src import jax_compat as jc
from pallas_triton._src.codegen import (
    Emitter,
    GlobalRef,
    LocalRef,
    TritonLoweringError,
    Value,
    check_pow2,
    dtype_name,
    expand,
    literal_operand,
    tl_dtype,
    unsupported,
)


@dataclasses.dataclass
class _Range:
    start: str  # offset inside the ref dimension
    stride: int
    size: int


@dataclasses.dataclass
class _Point:
    index: str


@dataclasses.dataclass
class _Gather:
    """A dimension indexed by a 1-D vector of indices (``x_ref[idx]``): the offsets are
    the vector's elements, so it reads (or writes) ``len(idx)`` arbitrary positions."""

    start: str
    stride: int
    index: str  # the vector's expression
    size: int
    shape: tuple[int, ...] | None = None  # a full index tensor (every dim indexed alike)


def _as_expr(x) -> str:
    if isinstance(x, Value):
        if x.shape:
            raise unsupported(
                "indexing a ref with an array of indices (gather/scatter)",
                "load the block and use jnp.take on it, or index with pl.ds",
            )
        return literal_operand(x)
    return repr(int(x))


def _add(a: str, b: str) -> str:
    if a == "0":
        return b
    if b == "0":
        return a
    return f"({a} + {b})"


def _mul(a: str, k: int) -> str:
    if k == 1 or a == "0":
        return a
    return f"({a} * {k})"


def _view(shape, transforms) -> list:
    view = [_Range("0", 1, int(n)) for n in shape]
    for t in transforms:
        if not isinstance(t, jc.NDIndexer):
            raise unsupported(
                f"the ref transform {type(t).__name__}",
                "index refs with ref[...], ref.at[...] and pl.ds",
            )
        ranged = [i for i, v in enumerate(view) if isinstance(v, _Range)]
        if len(t.indices) != len(ranged):
            raise TritonLoweringError(f"indexer {t} does not match the ref view")
        new = list(view)
        arrays = [i for i in t.indices if isinstance(i, Value) and i.shape]
        if arrays and len(arrays) == len(t.indices) and len(
                {tuple(a.shape) for a in arrays}) == 1 and all(
                view[p].stride == 1 for p in ranged):
            # Pure advanced indexing with index tensors of one shape (rows[:, None] and
            # cols[None] after broadcasting): each is the offset tensor of its dim.
            for pos, idx in zip(ranged, t.indices):
                new[pos] = _Gather(view[pos].start, 1, idx.expr, 0, tuple(idx.shape))
            view = new
            continue
        for pos, idx in zip(ranged, t.indices):
            cur = view[pos]
            if isinstance(idx, jc.Slice):
                if isinstance(idx.size, Value):
                    raise unsupported("a pl.ds slice with a traced size", "use a static size")
                start = _as_expr(idx.start)
                new[pos] = _Range(_add(cur.start, _mul(start, cur.stride)),
                                  cur.stride * int(idx.stride), int(idx.size))
            elif isinstance(idx, Value) and len(idx.shape) == 1 and cur.stride == 1 and \
                    sum(isinstance(i, Value) and bool(i.shape) for i in t.indices) == 1:
                new[pos] = _Gather(cur.start, 1, idx.expr, idx.shape[0])
            else:
                new[pos] = _Point(_add(cur.start, _mul(_as_expr(idx), cur.stride)))
        view = new
    return view


def _result_shape(view) -> tuple[int, ...]:
    full = [v.shape for v in view if isinstance(v, _Gather) and v.shape is not None]
    if full:
        return full[0]
    return tuple(v.size for v in view if isinstance(v, _Range | _Gather))


def _address(em: Emitter, ref: GlobalRef, transforms):
    """Pointer and mask expressions (names) for ``ref`` viewed through ``transforms``."""
    view = _view(ref.shape, transforms)
    shape = _result_shape(view)
    check_pow2(shape, f"a read or write of the block of {ref.origin}")
    rank = len(shape)
    terms, conds = [], []
    it = iter(view)
    axis = 0
    for stride, dim in zip(ref.strides, ref.dims):
        if dim.squeezed:
            elem, inner = dim.start, None
        else:
            v = next(it)
            if isinstance(v, _Point):
                inner = v.index
            elif isinstance(v, _Gather) and v.shape is not None:
                inner = _add(v.start, v.index)  # already a full index tensor
            elif isinstance(v, _Gather):
                inner = expand(_add(v.start, v.index), axis, rank)
                axis += 1
            else:
                ar = f"tl.arange(0, {v.size})"
                if v.stride != 1:
                    ar = f"{ar} * {v.stride}"
                inner = expand(_add(v.start, ar) if v.start != "0" else ar, axis, rank)
                axis += 1
            elem = _add(dim.start, inner)
        if dim.extent > 1 or dim.start != "0" or (inner not in (None, "0")):
            terms.append(_mul(elem, int(stride)))
        if dim.mask_hi:
            conds.append(_cond(elem, "<", str(dim.extent)))
        if dim.mask_lo:
            conds.append(_cond(elem, ">=", "0"))
        if dim.bound is not None and inner is not None:
            conds.append(_cond(inner, "<", dim.bound))
    conds = [c for c in conds if c is not None]
    if rank and conds:
        # Compare full-shape index tensors, so that every mask has the block's shape
        # even when only scalar (squeezed or integer-indexed) dimensions need one.
        zeros = em.fresh("zeros")
        em.line(f"{zeros} = tl.zeros({list(shape)}, tl.int32)")
        conds = [c if c is None else c.replace("(", f"({zeros} + ", 1) for c in conds]
    offset = " + ".join(terms) if terms else "0"
    ptr = em.fresh("ptr")
    em.line(f"{ptr} = {ref.ptr} + {offset}")
    mask = None
    if conds:
        mask = em.fresh("mask")
        em.line(f"{mask} = " + " & ".join(conds))
    return ptr, mask, shape


def _cond(lhs: str, op: str, rhs: str) -> str | None:
    """``(lhs op rhs)``, or None when both sides are integer constants and it holds."""
    try:
        a, b = int(lhs), int(rhs)
    except ValueError:
        return f"({lhs} {op} {rhs})"
    holds = a < b if op == "<" else a >= b
    return None if holds else "(tl.zeros([], tl.int1))"


def _combine_masks(em: Emitter, a: str | None, b: Value | None, shape) -> str | None:
    if b is None:
        return a
    if a is None:
        return b.expr
    name = em.fresh("mask")
    em.line(f"{name} = {a} & {b.expr}")
    return name


def _check_not_shared(ref, access: str) -> None:
    """Plain accesses of a block that parallel programs share would race: reject them."""
    if getattr(ref, "shared_along", ()):
        axes = ", ".join(map(str, ref.shared_along))
        raise unsupported(
            f"a {access} of {ref.origin}, whose block programs running in parallel along "
            f"grid axes {axes} share (its index map ignores them)",
            "update it with pallas.atomics (or pltriton.atomic_*), or give it a block per "
            "program; an axis that no output's index map uses runs as a loop instead")


def load(em: Emitter, ref, transforms, *, mask: Value | None = None,
         other: Value | None = None, extra: str = "") -> Value:
    if isinstance(ref, LocalRef):
        return _local_get(em, ref, transforms, mask)
    _check_not_shared(ref, "plain read")
    ptr, bmask, shape = _address(em, ref, transforms)
    m = _combine_masks(em, bmask, mask, shape)
    args = [ptr]
    if m is not None:
        args.append(f"mask={m}")
        fill = other.expr if other is not None else "0"
        args.append(f"other={fill}")
    if extra:
        args.append(extra)
    return em.assign(f"tl.load({', '.join(args)})", shape, ref.dtype)


def store(em: Emitter, ref, transforms, val: Value, *, mask: Value | None = None,
          want_old: bool = True, extra: str = "") -> Value | None:
    """Writes ``val``; returns the previous contents when ``want_old``."""
    if isinstance(ref, LocalRef):
        return _local_swap(em, ref, transforms, val, mask)
    _check_not_shared(ref, "plain write")
    old = None
    if want_old:
        old = load(em, ref, transforms, mask=mask)
        if mask is not None:
            old = _exchanged(em, old, val, mask)
    ptr, bmask, shape = _address(em, ref, transforms)
    m = _combine_masks(em, bmask, mask, shape)
    v = literal_operand(val)
    if val.literal or (val.shape == () and shape != ()):
        v = f"tl.full({list(shape)}, {v}, {tl_dtype(ref.dtype)})"
    args = [ptr, v]
    if m is not None:
        args.append(f"mask={m}")
    if extra:
        args.append(extra)
    em.line(f"tl.store({', '.join(args)})")
    return old


def atomic(em: Emitter, op: str, ref, transforms, val: Value, *, mask: Value | None,
           cmp: Value | None = None, sem: str | None = None) -> Value:
    if isinstance(ref, LocalRef):
        raise unsupported(f"atomic_{op} on the scratch buffer {ref.origin} (registers)",
                          "apply atomics to output refs, which live in global memory")
    ptr, bmask, shape = _address(em, ref, transforms)
    m = _combine_masks(em, bmask, mask, shape)
    args = [ptr]
    if cmp is not None:
        args.append(literal_operand(cmp))
    args.append(literal_operand(val))
    if m is not None and cmp is None:
        args.append(f"mask={m}")
    if sem:
        args.append(f'sem="{sem}"')
    # Program order: the program's earlier writes (made by all of its threads) happen
    # before the atomic, which a single thread may issue (a scalar release of a lock).
    em.line("tl.debug_barrier()")
    return em.assign(f"tl.atomic_{op}({', '.join(args)})", shape, ref.dtype)


def _local_view(ref: LocalRef, transforms):
    """The view as (kept dims, point dims {dim: index}); partial ranges are unsupported."""
    view = _view(ref.shape, transforms)
    points = {}
    for d, (v, n) in enumerate(zip(view, ref.shape)):
        if isinstance(v, _Point):
            points[d] = v.index
        elif not (v.start == "0" and v.stride == 1 and v.size == n):
            raise unsupported(
                f"a partial slice of the scratch buffer {ref.origin}",
                "read and write scratch buffers whole (ref[...]) or at integer indices")
    return points


def _selector(d: int, idx: str, n: int, rank: int) -> str:
    return f"({expand(f'tl.arange(0, {n})', d, rank)} == {idx})"


def _local_get(em, ref: LocalRef, transforms, mask):
    points = _local_view(ref, transforms)
    if not points:  # a copy: a later store to the buffer must not change what was read
        return em.assign(ref.var, ref.shape, ref.dtype)
    rank = len(ref.shape)
    cur = ref.var
    if dtype_name(ref.dtype) == "bfloat16":
        cur = f"{cur}.to(tl.float32)"
    shape = list(ref.shape)
    # Select the indexed elements by masking and summing, highest dimension first.
    for d in sorted(points, reverse=True):
        zero = "False" if dtype_name(ref.dtype) == "bool" else "0"
        cur = f"tl.sum(tl.where({_selector(d, points[d], ref.shape[d], rank)}, {cur}, {zero}), axis={d})"
        del shape[d]
        rank -= 1
        cur = em.assign(cur, tuple(shape), ref.dtype).expr
    return em.assign(f"{cur}.to({tl_dtype(ref.dtype)})", tuple(shape), ref.dtype)


def _local_swap(em, ref: LocalRef, transforms, val: Value, mask):
    points = _local_view(ref, transforms)
    old = _local_get(em, ref, transforms, None) if points else em.assign(
        ref.var, ref.shape, ref.dtype)
    rank = len(ref.shape)
    new = literal_operand(val)
    kept = [d for d in range(rank) if d not in points]
    if val.shape == () and kept:
        new = f"tl.full({[ref.shape[d] for d in kept]}, {new}, {tl_dtype(ref.dtype)})"
    if mask is not None:
        new = f"tl.where({mask.expr}, {new}, {old.expr})"
    if points:
        if kept:
            idx = ", ".join("None" if d in points else ":" for d in range(rank))
            new = f"({new})[{idx}]"
        sel = " & ".join(_selector(d, i, ref.shape[d], rank) for d, i in points.items())
        new = f"tl.where({sel}, {new}, {ref.var})"
    elif val.shape != ref.shape:
        new = f"tl.full({list(ref.shape)}, {new}, {tl_dtype(ref.dtype)})"
    em.line(f"{ref.var} = {new}")
    return old if mask is None else _exchanged(em, old, val, mask)


def _exchanged(em, old: Value, val: Value, mask: Value) -> Value:
    """What a masked swap returns: the old contents where it wrote, ``val`` in masked-off
    lanes (a partial exchange, as upstream's discharge defines it)."""
    return em.assign(f"tl.where({mask.expr}, {old.expr}, {literal_operand(val)})",
                     old.shape, old.dtype)


def unflatten_transforms(tree, leaves):
    return jax.tree_util.tree_unflatten(tree, list(leaves))
