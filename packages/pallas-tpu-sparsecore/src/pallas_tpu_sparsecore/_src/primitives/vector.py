"""Vector-subcore value primitives: ``bitcast``, ``pack``/``unpack``, masked ``cumsum``
and ``cummax``, ``scan_count``, ``sort_key_val`` and the mask all-reductions
``all_reduce_population_count`` / ``all_reduce_ffs``.

Each primitive's abstract evaluation, interpreter rule (plain JAX) and Mosaic lowering
(``vector.bitcast``, ``tpu.pack_subelements``/``unpack_subelements``, ``tpu.scan``,
``tpu.scan_count``, ``tpu.sort``, ``tpu.all_reduce``) sit together below.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
from jax import lax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, vector
from jaxlib.mosaic.python import tpu

from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.info import check_vector_shape, get_sparse_core_info
from pallas_tpu_sparsecore._src.lowering.table import rule
from pallas_tpu_sparsecore._src.primitives.refs import as_array

_SCAN_DTYPES = (jnp.dtype(jnp.int32), jnp.dtype(jnp.uint32), jnp.dtype(jnp.float32))


def _bits(dtype) -> int:
    return jnp.dtype(dtype).itemsize * 8


def _check_scan_operand(fn, x, mask):
    x = as_array(fn, "x", x)
    if x.ndim != 1:
        raise ValueError(f"{fn}: x must be a 1-D vector; got shape {x.shape}")
    if x.dtype not in _SCAN_DTYPES:
        raise TypeError(f"{fn}: x has dtype {x.dtype.name}; supported: int32, uint32, "
                        f"float32")
    check_vector_shape(f"{fn}: x", x.shape, x.dtype)
    if mask is None:
        return x, jnp.ones(x.shape, jnp.bool_)
    mask = as_array(fn, "mask", mask)
    if mask.dtype != jnp.bool_ or mask.shape != x.shape:
        raise TypeError(f"{fn}: mask must be a bool vector of shape {x.shape}; got "
                        f"{mask.dtype.name}{list(mask.shape)}")
    return x, mask


# ======================================================================================
# bitcast


bitcast_p = jc.Primitive("sc_bitcast")


def bitcast(x: jax.Array, dtype) -> jax.Array:
    """Reinterprets the bits of ``x`` as ``dtype``, keeping the rank: the last dimension
    grows or shrinks by the ratio of the element widths."""
    x = as_array("plsc.bitcast", "x", x)
    dtype = jnp.dtype(dtype)
    if x.dtype == dtype:
        return x
    return bitcast_p.bind(x, dtype=dtype)


def _bitcast_abstract_eval(x, *, dtype):
    old, new = _bits(x.dtype), _bits(dtype)
    if old == new:
        return jc.ShapedArray(x.shape, dtype)
    if not x.shape:
        raise ValueError(f"plsc.bitcast: a 0-d {x.dtype.name} value cannot become "
                         f"{dtype.name} (a different width needs a last dimension)")
    last, rem = divmod(x.shape[-1] * old, new)
    if rem:
        raise ValueError(
            f"plsc.bitcast: the last dimension ({x.shape[-1]} x {old} bits) does not "
            f"divide into {dtype.name} elements of {new} bits")
    return jc.ShapedArray((*x.shape[:-1], last), dtype)


def _bitcast_rule(ctx, eqn, invals):
    (x,) = invals
    dtype = eqn.params["dtype"]
    old, new = _bits(x.dtype), _bits(dtype)
    if old == new:
        return [lax.bitcast_convert_type(x, dtype)]
    if old > new:  # each element becomes old/new narrower ones
        y = lax.bitcast_convert_type(x, dtype)
        return [y.reshape(*x.shape[:-1], x.shape[-1] * (old // new))]
    k = new // old
    y = x.reshape(*x.shape[:-1], x.shape[-1] // k, k)
    return [lax.bitcast_convert_type(y, dtype)]


bitcast_p.def_abstract_eval(_bitcast_abstract_eval)


@rule(bitcast_p)
def _bitcast_lowering(lctx, eqn, x):
    x = tpx.materialize(x, tpx.aval_in(eqn, 0))
    return vector.bitcast(tpx.types.aval_type(tpx.aval_out(eqn)), x)


# ======================================================================================
# pack / unpack


class PackFormat(enum.Enum):
    """How ``pack`` lays two vectors out in one of half-width elements."""

    #: ``a``, ``b`` of shape ``(n,)`` -> shape ``(n, 2)`` holding ``a`` then ``b`` in
    #: row-major order (``concatenate([a, b]).reshape(n, 2)``).
    COMPRESSED = "compressed"
    #: ``a``, ``b`` -> ``[a0, b0, a1, b1, ...]`` of shape ``(2n,)``.
    INTERLEAVED = "interleaved"


pack_p = jc.Primitive("sc_pack")
unpack_p = jc.Primitive("sc_unpack")
unpack_p.multiple_results = True

_HALF = {jnp.dtype(jnp.float32): jnp.dtype(jnp.bfloat16),
         jnp.dtype(jnp.int32): jnp.dtype(jnp.int16)}
_DOUBLE = {v: k for k, v in _HALF.items()}


def _format(fn, format):
    if not isinstance(format, PackFormat):
        raise TypeError(f"{fn}: format must be a plsc.PackFormat (COMPRESSED or "
                        f"INTERLEAVED); got {format!r}")
    return format


def pack(a: jax.Array, b: jax.Array, /, *, format: PackFormat,
         preferred_element_type=None) -> jax.Array:
    """Packs two vectors into one of half-width elements (``float32 -> bfloat16``,
    ``int32 -> int16`` by default), laid out as ``format`` says."""
    fn = "plsc.pack"
    a, b = as_array(fn, "a", a), as_array(fn, "b", b)
    pet = None if preferred_element_type is None else jnp.dtype(preferred_element_type)
    return pack_p.bind(a, b, format=_format(fn, format), preferred_element_type=pet)


def unpack(ab: jax.Array, /, *, format: PackFormat,
           preferred_element_type=None) -> tuple[jax.Array, jax.Array]:
    """Inverse of :func:`pack`: the two vectors, widened (``bfloat16 -> float32``,
    ``int16 -> int32`` by default)."""
    fn = "plsc.unpack"
    ab = as_array(fn, "ab", ab)
    pet = None if preferred_element_type is None else jnp.dtype(preferred_element_type)
    return tuple(unpack_p.bind(ab, format=_format(fn, format), preferred_element_type=pet))


def _result_dtype(fn: str, verb: str, dtype, preferred, default: dict, bits: int):
    """The element type :func:`pack`/:func:`unpack` produce from ``dtype``: ``preferred``
    when given (it must have ``bits`` bits), else ``default[dtype]``."""
    if preferred is None:
        if dtype not in default:
            raise TypeError(f"{fn}: {verb} {' or '.join(d.name for d in default)} vectors "
                            f"(or pass preferred_element_type=); got {dtype.name}")
        return default[dtype]
    if _bits(preferred) != bits:
        raise ValueError(f"{fn}: preferred_element_type must have {bits} bits; got "
                         f"{preferred.name}")
    return preferred


def _pack_abstract_eval(a, b, *, format, preferred_element_type):
    fn = "plsc.pack"
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"{fn}: a and b must be 1-D vectors of one shape; got {a.shape} "
                         f"and {b.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"{fn}: a and b must have one dtype; got {a.dtype.name} and "
                        f"{b.dtype.name}")
    out = _result_dtype(fn, "packs", a.dtype, preferred_element_type, _HALF,
                        _bits(a.dtype) // 2)
    shape = (2 * a.shape[0],) if format is PackFormat.INTERLEAVED else (a.shape[0], 2)
    return jc.ShapedArray(shape, out)


def _unpack_abstract_eval(ab, *, format, preferred_element_type):
    fn = "plsc.unpack"
    if format is PackFormat.INTERLEAVED and (ab.ndim != 1 or ab.shape[0] % 2):
        raise ValueError(f"{fn}: INTERLEAVED takes a 1-D vector of even length; got "
                         f"{ab.shape}")
    if format is PackFormat.COMPRESSED and (ab.ndim != 2 or ab.shape[1] != 2):
        raise ValueError(f"{fn}: COMPRESSED takes shape (n, 2); got {ab.shape}")
    out = _result_dtype(fn, "unpacks", ab.dtype, preferred_element_type, _DOUBLE,
                        2 * _bits(ab.dtype))
    n = ab.size // 2
    return (jc.ShapedArray((n,), out),) * 2


def _pack_rule(ctx, eqn, invals):
    a, b = invals
    out = eqn.outvars[0].aval
    a, b = a.astype(out.dtype), b.astype(out.dtype)
    if eqn.params["format"] is PackFormat.INTERLEAVED:
        return [jnp.stack([a, b], axis=1).reshape(out.shape)]
    return [jnp.concatenate([a, b]).reshape(out.shape)]


def _unpack_rule(ctx, eqn, invals):
    (ab,) = invals
    out = eqn.outvars[0].aval
    n = out.shape[0]
    if eqn.params["format"] is PackFormat.INTERLEAVED:
        pairs = ab.reshape(n, 2)
        a, b = pairs[:, 0], pairs[:, 1]
    else:
        flat = ab.reshape(2 * n)
        a, b = flat[:n], flat[n:]
    return [a.astype(out.dtype), b.astype(out.dtype)]


pack_p.def_abstract_eval(_pack_abstract_eval)
unpack_p.def_abstract_eval(_unpack_abstract_eval)


def _format_attr(format: PackFormat) -> ir.Attribute:
    return ir.Attribute.parse(f"#tpu.pack_format<{format.value}>")


@rule(pack_p)
def _pack_lowering(lctx, eqn, a, b):
    a, b = (tpx.materialize(v, tpx.aval_in(eqn, i)) for i, v in enumerate((a, b)))
    out = tpx.types.aval_type(tpx.aval_out(eqn))
    return tpu.pack_subelements(out, [a, b], [0, 1], _format_attr(eqn.params["format"]))


@rule(unpack_p)
def _unpack_lowering(lctx, eqn, ab):
    ab = tpx.materialize(ab, tpx.aval_in(eqn, 0))
    out = tpx.types.aval_type(tpx.aval_out(eqn))
    fmt = _format_attr(eqn.params["format"])
    return [tpu.unpack_subelements(out, ab, i, fmt) for i in (0, 1)]


# ======================================================================================
# masked cumulative sum / max


masked_cumsum_p = jc.Primitive("sc_masked_cumsum")
masked_cummax_p = jc.Primitive("sc_masked_cummax")


def cumsum(x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Running sum of ``x`` over the elements where ``mask`` is True (others add 0)."""
    x, mask = _check_scan_operand("plsc.cumsum", x, mask)
    return masked_cumsum_p.bind(x, mask)


def cummax(x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Running max of ``x`` over the elements where ``mask`` is True; before the first
    such element, ``x`` passes through."""
    x, mask = _check_scan_operand("plsc.cummax", x, mask)
    return masked_cummax_p.bind(x, mask)


for _p in (masked_cumsum_p, masked_cummax_p):
    _p.def_abstract_eval(lambda x, mask: jc.ShapedArray(x.shape, x.dtype))


def _lowest(dtype):
    dt = jnp.dtype(dtype)
    return -jnp.inf if dt.kind == "f" else jnp.iinfo(dt).min


def _cumsum_rule(ctx, eqn, invals):
    x, mask = invals
    return [jnp.cumsum(jnp.where(mask, x, jnp.zeros_like(x)), dtype=x.dtype)]


def _cummax_rule(ctx, eqn, invals):
    x, mask = invals
    running = lax.cummax(jnp.where(mask, x, jnp.asarray(_lowest(x.dtype), x.dtype)))
    seen = jnp.cumsum(mask.astype(jnp.int32)) > 0
    return [jnp.where(seen, running, x)]


def _sign_flip(x, dtype):
    """Mosaic's SparseCore scans and sorts compare integers unsigned: flipping the sign
    bit of int32 values makes that order the signed one."""
    if jnp.dtype(dtype) != jnp.int32:
        return x, None
    i32 = ir.IntegerType.get_signless(32)
    bit = vector.broadcast(x.type, arith.constant(i32, ir.IntegerAttr.get(i32, -(1 << 31))))
    return arith.xori(x, bit), bit


def _scan_lowering(kind):
    def lower(lctx, eqn, x, mask):
        dtype = tpx.aval_in(eqn, 0).dtype
        x = tpx.materialize(x, tpx.aval_in(eqn, 0))
        mask = tpx.materialize(mask, tpx.aval_in(eqn, 1))
        bit = None
        if kind == "max":
            x, bit = _sign_flip(x, dtype)
        out = tpu.scan(x.type, x, ir.Attribute.parse(f"#tpu.reduction_kind<{kind}>"),
                       mask=mask)
        return arith.xori(out, bit) if bit is not None else out

    return lower


rule(masked_cumsum_p)(_scan_lowering("sum"))
rule(masked_cummax_p)(_scan_lowering("max"))


# ======================================================================================
# scan_count


scan_count_p = jc.Primitive("sc_scan_count")
scan_count_p.multiple_results = True


def scan_count(x: jax.Array, mask: jax.Array | None = None
               ) -> tuple[jax.Array, jax.Array]:
    """For each element, how many times its value occurred so far (counting itself,
    among the elements where ``mask`` is True), and a mask of the last occurrence of
    each value."""
    x, mask = _check_scan_operand("plsc.scan_count", x, mask)
    return tuple(scan_count_p.bind(x, mask))


scan_count_p.def_abstract_eval(
    lambda x, mask: (jc.ShapedArray(x.shape, jnp.int32), jc.ShapedArray(x.shape, jnp.bool_)))


def _scan_count_rule(ctx, eqn, invals):
    x, mask = invals
    same = (x[:, None] == x[None, :]) & mask[:, None] & mask[None, :]
    n = x.shape[0]
    earlier = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]
    later = jnp.arange(n)[None, :] > jnp.arange(n)[:, None]
    counts = jnp.sum(same & earlier, axis=1).astype(jnp.int32)
    last = mask & ~jnp.any(same & later, axis=1)
    return [jnp.where(mask, counts, 0), last]


@rule(scan_count_p)
def _scan_count_lowering(lctx, eqn, x, mask):
    x = tpx.materialize(x, tpx.aval_in(eqn, 0))
    mask = tpx.materialize(mask, tpx.aval_in(eqn, 1))
    out_mask, counts = tpu.scan_count(mask, x)  # the op yields the mask first
    return [counts, out_mask]


# ======================================================================================
# sort_key_val


masked_sort_p = jc.Primitive("sc_masked_sort")
masked_sort_p.multiple_results = True


def sort_key_val(keys: jax.Array, values: jax.Array, *, mask: jax.Array | None = None,
                 descending: bool = False):
    """Sorts ``keys`` (and ``values`` with them) within one vector; elements where
    ``mask`` is False go last. Returns ``(keys, values)``, plus the sorted mask when a
    mask is given."""
    fn = "plsc.sort_key_val"
    keys, values = as_array(fn, "keys", keys), as_array(fn, "values", values)
    lanes = (get_sparse_core_info().num_lanes,)
    if keys.dtype not in _SCAN_DTYPES:
        raise TypeError(f"{fn}: keys have dtype {keys.dtype.name}; supported: int32, "
                        f"uint32, float32")
    for name, v in (("keys", keys), ("values", values)):
        if tuple(v.shape) != lanes:
            raise ValueError(f"{fn}: {name} must have shape {lanes} (one vector register)"
                             f"; got {v.shape}")
    if jnp.dtype(values.dtype).itemsize != 4:
        raise TypeError(f"{fn}: values must have a 32-bit dtype; got {values.dtype.name}")
    extra = []
    if mask is not None:
        mask = as_array(fn, "mask", mask)
        if mask.dtype != jnp.bool_ or tuple(mask.shape) != lanes:
            raise TypeError(f"{fn}: mask must be a bool vector of shape {lanes}")
        extra = [mask]
    return tuple(masked_sort_p.bind(keys, values, *extra, descending=bool(descending)))


masked_sort_p.def_abstract_eval(lambda *avals, descending: tuple(avals))


def _sort_rule(ctx, eqn, invals):
    keys, values, *maybe_mask = invals
    mask = maybe_mask[0] if maybe_mask else jnp.ones(keys.shape, jnp.bool_)
    order = jnp.argsort(keys, stable=True, descending=eqn.params["descending"])
    order = order[jnp.argsort(~mask[order], stable=True)]  # invalid ones last
    out = [keys[order], values[order]]
    return out + ([mask[order]] if maybe_mask else [])


@rule(masked_sort_p)
def _sort_lowering(lctx, eqn, keys, values, *maybe_mask):
    avals = [v.aval for v in eqn.invars]
    keys, values = tpx.materialize(keys, avals[0]), tpx.materialize(values, avals[1])
    if maybe_mask:
        mask = tpx.materialize(maybe_mask[0], avals[2])
    else:
        mask = tpx.const(avals[0].shape, jnp.bool_, True)
    keys, bit = _sign_flip(keys, avals[0].dtype)
    out_mask, k, v = tpu.sort(mask.type, keys.type, values.type, keys, values, mask=mask,
                              descending=eqn.params["descending"])
    if bit is not None:
        k = arith.xori(k, bit)
    return [k, v, out_mask] if maybe_mask else [k, v]


# ======================================================================================
# all_reduce_population_count / all_reduce_ffs


all_reduce_population_count_p = jc.Primitive("sc_all_reduce_population_count")
all_reduce_ffs_p = jc.Primitive("sc_all_reduce_ffs")


def _check_reduce_operand(fn, x, reduce):
    x = as_array(fn, "x", x)
    if x.dtype != jnp.bool_ or x.ndim != 1:
        raise TypeError(f"{fn}: x must be a 1-D bool vector (a mask); got "
                        f"{x.dtype.name}{list(x.shape)}")
    if not isinstance(reduce, int) or reduce < 1 or x.shape[0] % reduce:
        raise ValueError(f"{fn}: reduce must be a positive divisor of {x.shape[0]}; got "
                         f"{reduce!r}")
    return x


def all_reduce_population_count(x: jax.Array, *, reduce: int = 1) -> jax.Array:
    """The number of True elements of ``x``, in every element of an int32 vector of
    ``len(x) // reduce`` elements."""
    x = _check_reduce_operand("plsc.all_reduce_population_count", x, reduce)
    return all_reduce_population_count_p.bind(x, reduce=reduce)


def all_reduce_ffs(x: jax.Array, *, reduce: int = 1) -> jax.Array:
    """The index of the first True element of ``x`` (``len(x)`` if none), in every
    element of an int32 vector of ``len(x) // reduce`` elements."""
    x = _check_reduce_operand("plsc.all_reduce_ffs", x, reduce)
    return all_reduce_ffs_p.bind(x, reduce=reduce)


for _p in (all_reduce_population_count_p, all_reduce_ffs_p):
    _p.def_abstract_eval(
        lambda x, reduce: jc.ShapedArray((x.shape[0] // reduce,), jnp.int32))


def _popcount_rule(ctx, eqn, invals):
    (x,) = invals
    n = x.shape[0] // eqn.params["reduce"]
    return [jnp.full((n,), jnp.sum(x.astype(jnp.int32)), jnp.int32)]


def _ffs_rule(ctx, eqn, invals):
    (x,) = invals
    n = x.shape[0] // eqn.params["reduce"]
    first = jnp.where(jnp.any(x), jnp.argmax(x), x.shape[0]).astype(jnp.int32)
    return [jnp.full((n,), first, jnp.int32)]


def _all_reduce_lowering(kind):
    def lower(lctx, eqn, x):
        x = tpx.materialize(x, tpx.aval_in(eqn, 0))
        out = tpx.types.aval_type(tpx.aval_out(eqn))
        return tpu.all_reduce(out, x, 0, ir.Attribute.parse(f"#tpu.reduction_kind<{kind}>"))

    return lower


rule(all_reduce_population_count_p)(_all_reduce_lowering("sum"))
rule(all_reduce_ffs_p)(_all_reduce_lowering("find_first_set"))


INTERPRET_RULES = {
    bitcast_p: _bitcast_rule, pack_p: _pack_rule, unpack_p: _unpack_rule,
    masked_cumsum_p: _cumsum_rule, masked_cummax_p: _cummax_rule,
    scan_count_p: _scan_count_rule, masked_sort_p: _sort_rule,
    all_reduce_population_count_p: _popcount_rule, all_reduce_ffs_p: _ffs_rule,
}
