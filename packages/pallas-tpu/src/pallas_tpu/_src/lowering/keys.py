"""Typed PRNG keys in a kernel become their uint32 words before Mosaic lowering.

Mosaic has no key type, so a kernel whose jaxpr holds typed keys (``jax.random.key``,
``pltpu.to_pallas_key`` operands, ``jax.random.fold_in`` ...) is rewritten into one
without them, as JAX lowers keys to XLA through their key data:

- A key ref (an operand, an output, scratch) is its key data's ref: shape
  ``(*shape, *key_shape)`` of uint32 (a Pallas TPU key is a row of two SMEM scalars);
  its block gets the key dims whole.
- A key value of shape ``S`` is held as its words: one uint32 array of shape ``S`` per
  element of the key shape. Structural operations (broadcast, reshape, select, slice,
  ...) apply to each word; loads and stores move each word (a scalar key in SMEM is
  scalar loads, never a vector).
- ``random_bits``/``fold_in``/``split``/``seed``/``wrap``/``unwrap`` run the key
  implementation on the words: for Pallas TPU keys the hardware PRNG
  (``prng_seed`` + ``prng_random_bits``) and one threefry round; for threefry2x32
  keys the ``threefry2x32`` hash on counters (``rules_random``), as
  ``jax_threefry_partitionable`` (JAX's default) computes it; for other
  implementations, and batched keys, the implementation's own function of the key data.

Calls (``jit``, ``custom_jvp``/``custom_vjp``, ``remat``) are inlined; ``cond``,
``while_loop``, ``scan`` and ``run_scoped`` bodies are rewritten. Kernels without keys are
returned unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.extend.core.primitives as P
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
from pallas_tpu._src import core_compat as cc
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src import prng_keys
from pallas_tpu._src.primitives import misc
from pallas_tpu._src.primitives import refs as R

U32 = jnp.dtype("uint32")


def _is_key(dtype) -> bool:
    return jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _aval_has_key(aval) -> bool:
    inner = getattr(aval, "inner_aval", aval)
    return hasattr(inner, "dtype") and _is_key(inner.dtype)


def _key_shape(dtype) -> tuple:
    return tuple(dtype._impl.key_shape)


def _phys_inner(aval):
    return jc.ShapedArray((*aval.shape, *_key_shape(aval.dtype)), U32)


def _phys_avals(aval) -> list:
    """The avals that stand for ``aval``: itself, a key ref's data ref, or a key value's
    words."""
    if isinstance(aval, jc.AbstractRef):
        if _is_key(aval.inner_aval.dtype):
            return [jc.AbstractRef(_phys_inner(aval.inner_aval),
                                   memory_space=aval.memory_space)]
        return [aval]
    if hasattr(aval, "dtype") and _is_key(aval.dtype):
        n = math.prod(_key_shape(aval.dtype))
        return [jc.ShapedArray(aval.shape, U32)] * n
    return [aval]


def has_keys(jaxpr) -> bool:
    """Whether ``jaxpr`` (or one nested in it) holds a typed key or a key ref."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    if any(_aval_has_key(v.aval) for v in [*jaxpr.constvars, *jaxpr.invars]):
        return True
    return any(_eqn_has_keys(e) for e in jaxpr.eqns)


def _eqn_has_keys(eqn) -> bool:
    if any(_aval_has_key(v.aval) for v in [*eqn.invars, *eqn.outvars]):
        return True
    return any(has_keys(j) for j in jc.core.jaxprs_in_params(eqn.params))


# -- values --------------------------------------------------------------------------------


@dataclasses.dataclass
class Words:
    """A key array of shape ``shape``: one uint32 array of that shape per key word."""

    impl: object
    shape: tuple
    words: list

    @property
    def key_shape(self) -> tuple:
        return tuple(self.impl.key_shape)

    def data(self):
        """The key data, ``(*shape, *key_shape)`` uint32."""
        return jnp.stack(self.words, axis=-1).reshape((*self.shape, *self.key_shape))

    @classmethod
    def of_data(cls, impl, data) -> Words:
        data = jnp.asarray(data)
        ks = tuple(impl.key_shape)
        shape = tuple(data.shape[:data.ndim - len(ks)])
        flat = data.reshape((*shape, math.prod(ks)))
        return cls(impl, shape, [flat[..., j] for j in range(math.prod(ks))])


@dataclasses.dataclass
class KeyRef:
    """A key ref: the ref of its key data (``(*shape, *key_shape)`` uint32)."""

    impl: object
    ref: object


def _flatten(value) -> list:
    if isinstance(value, Words):
        return list(value.words)
    if isinstance(value, KeyRef):
        return [value.ref]
    return [value]


def _unflatten(avals, flat) -> list:
    out, it = [], iter(flat)
    for aval in avals:
        if isinstance(aval, jc.AbstractRef) and _is_key(aval.inner_aval.dtype):
            out.append(KeyRef(aval.inner_aval.dtype._impl, next(it)))
        elif hasattr(aval, "dtype") and _is_key(aval.dtype) and \
                not isinstance(aval, jc.AbstractRef):
            n = math.prod(_key_shape(aval.dtype))
            out.append(Words(aval.dtype._impl, tuple(aval.shape),
                             [next(it) for _ in range(n)]))
        else:
            out.append(next(it))
    return out


# -- the rewrite -------------------------------------------------------------------------


def _closed(jaxpr, consts, name: str):
    """``jaxpr`` rewritten over the flat stand-ins of its inputs and outputs:
    (ClosedJaxpr, out avals)."""
    in_avals = [a for v in jaxpr.invars for a in _phys_avals(v.aval)]

    def fn(*flat):
        outs = evaluate(jaxpr, consts, _unflatten([v.aval for v in jaxpr.invars], flat))
        return [x for o in outs for x in _flatten(o)]

    new, out_avals, new_consts = jc.trace_to_jaxpr(fn, in_avals, name)
    return jc.ClosedJaxpr(new, new_consts), out_avals


def _const(c):
    if hasattr(c, "dtype") and _is_key(c.dtype):
        return Words.of_data(c.dtype._impl, jax.random.key_data(c))
    return c


def evaluate(jaxpr, consts, args) -> list:
    """Evaluates ``jaxpr`` (in a trace) with keys as :class:`Words`/:class:`KeyRef`."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jc.Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = _const(c)
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        vals = [read(v) for v in eqn.invars]
        with jc.source_info_util.user_context(eqn.source_info.traceback), eqn.ctx.manager:
            if not _eqn_has_keys(eqn):
                outs = _bind(eqn, vals)
            else:
                rule = _RULES.get(eqn.primitive)
                if rule is not None:
                    outs = rule(eqn, *vals)
                elif "refs" in eqn.params:  # DMAs and the like, on key refs
                    outs = _ref_operands(eqn, vals)
                else:
                    outs = _per_word(eqn, vals)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _bind(eqn, vals):
    params = dict(eqn.primitive.get_bind_params(eqn.params))
    subfuns = params.pop("subfuns", ())
    return eqn.primitive.bind(*subfuns, *vals, **params)


def _per_word(eqn, vals):
    """A structural primitive over keys (broadcast, reshape, select_n, slice,
    concatenate, ...): applied to each word, other operands as they are."""
    name = eqn.primitive.name
    if any(isinstance(v, KeyRef) for v in vals) or list(jc.core.jaxprs_in_params(eqn.params)):
        raise NotImplementedError(
            f"'{name}' on typed PRNG keys or key refs in a Mosaic TPU kernel (keys are "
            f"lowered as their uint32 words; this primitive has no rule for them)")
    keys = [v for v in vals if isinstance(v, Words)]
    out_avals = [v.aval for v in eqn.outvars]
    if not all(_is_key(a.dtype) for a in out_avals):
        raise NotImplementedError(f"'{name}' of typed PRNG keys with a non-key result in "
                                  f"a Mosaic TPU kernel")
    impl = keys[0].impl
    n = math.prod(tuple(impl.key_shape))
    per_word = []
    for j in range(n):
        ins = [v.words[j] if isinstance(v, Words) else v for v in vals]
        outs = _bind(eqn, ins)
        per_word.append(outs if eqn.primitive.multiple_results else [outs])
    res = [Words(impl, tuple(a.shape), [per_word[j][k] for j in range(n)])
           for k, a in enumerate(out_avals)]
    return res if eqn.primitive.multiple_results else res[0]


# -- refs ---------------------------------------------------------------------------------


def _view(ref: KeyRef, flat_transforms, tree):
    """The key data ref seen through ``ref[...]``'s indexers (over the key array's
    dims; the key dims stay whole)."""
    view = ref.ref
    for t in jax.tree_util.tree_unflatten(tree, flat_transforms):
        if not isinstance(t, jc.NDIndexer):
            raise NotImplementedError(f"the ref transform {type(t).__name__} on a typed key "
                                      f"ref in a Mosaic TPU kernel")
        view = view.at[tuple(t.indices)]
    return view


def _word_indices(impl):
    ks = tuple(impl.key_shape)
    return [tuple(int(i) for i in np.unravel_index(j, ks)) for j in range(math.prod(ks))]


def _get(eqn, ref, *flat):
    if not isinstance(ref, KeyRef):
        return _bind(eqn, [ref, *flat])
    view = _view(ref, flat, eqn.params["tree"])
    shape = tuple(eqn.outvars[0].aval.shape)
    return Words(ref.impl, shape, [view[(Ellipsis, *w)] for w in _word_indices(ref.impl)])


def _swap(eqn, ref, val, *flat):
    if not isinstance(ref, KeyRef):
        raise NotImplementedError("storing typed keys into a non-key ref")
    view = _view(ref, flat, eqn.params["tree"])
    shape = tuple(eqn.outvars[0].aval.shape)
    old = []
    for w, word in zip(_word_indices(ref.impl), val.words):
        old.append(view[(Ellipsis, *w)])
        view[(Ellipsis, *w)] = word
    return Words(ref.impl, shape, old)


def _ref_operands(eqn, vals):
    """A primitive taking refs packed as ``refs`` (``pallas.plugins.RefOperands``:
    DMAs, ...): each key ref becomes its key data's ref seen through the same indexers."""
    spec = eqn.params["refs"]
    end = R.spec_end(spec)
    ops, layout = [], []
    for entry in R.unflatten(spec, vals):
        if entry is None:
            layout.append(None)
            continue
        base, flat, tree = entry
        if isinstance(base, KeyRef):
            base, flat, tree = R.flatten_ref(_view(base, flat, tree))
        layout.append((len(ops), len(flat), tree))
        ops += [base, *flat]
    rest = list(vals[end:])
    if any(isinstance(v, (Words, KeyRef)) for v in [*ops, *rest]):
        raise NotImplementedError(f"'{eqn.primitive.name}' with typed PRNG keys as "
                                  f"operands in a Mosaic TPU kernel")
    params = dict(eqn.primitive.get_bind_params(eqn.params))
    params.pop("subfuns", None)
    params["refs"] = tuple(layout)
    return eqn.primitive.bind(*ops, *rest, **params)


def _memory_ref(t):
    if _is_key(t.dtype):
        return dataclasses.replace(t, inner_aval=_phys_inner(t.inner_aval))
    return t


def _run_scoped(eqn, *consts):
    p = eqn.params
    body = p["jaxpr"]
    closed, _ = _closed(body, (), "run_scoped body")
    flat_consts = [x for c in consts for x in _flatten(c)]
    new = jc.convert_constvars_jaxpr(closed.jaxpr)
    outs = cc.run_scoped_p.bind(
        *closed.consts, *flat_consts, jaxpr=new,
        types=tuple(_memory_ref(t) for t in p["types"]),
        num_consts=len(closed.consts) + len(flat_consts),
        collective_axes=p["collective_axes"])
    return _unflatten([v.aval for v in eqn.outvars], outs)


# -- calls and control flow ------------------------------------------------------------------


def _inline(param):
    def rule(eqn, *vals):
        sub = eqn.params[param]
        return evaluate(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), vals)

    return rule


def _cond(eqn, index, *ops):
    branches = [_closed(b.jaxpr, b.consts, "cond branch")[0] for b in eqn.params["branches"]]
    params = dict(eqn.params, branches=tuple(branches))
    outs = P.cond_p.bind(index, *[x for o in ops for x in _flatten(o)], **params)
    return _unflatten([v.aval for v in eqn.outvars], outs)


def _while(eqn, *vals):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = vals[:nc], vals[nc:nc + nb], vals[nc + nb:]

    def rewrite(closed, name):
        return _closed(closed.jaxpr, closed.consts, name)[0]

    fc = [x for c in cconsts for x in _flatten(c)]
    fb = [x for c in bconsts for x in _flatten(c)]
    outs = P.while_p.bind(
        *fc, *fb, *[x for c in carry for x in _flatten(c)],
        **dict(p, cond_jaxpr=rewrite(p["cond_jaxpr"], "while cond"),
               body_jaxpr=rewrite(p["body_jaxpr"], "while body"),
               cond_nconsts=len(fc), body_nconsts=len(fb)))
    return _unflatten([v.aval for v in eqn.outvars], outs)


def _scan(eqn, *vals):
    """A scan (``fori_loop`` of static trip count, ``lax.scan``) whose consts, carry or
    scanned operands hold keys or key refs (say the buffers of ``emit_pipeline``)."""
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    groups = [vals[:nc], vals[nc:nc + nk], vals[nc + nk:]]
    flat = [[x for v in g for x in _flatten(v)] for g in groups]
    body = _closed(p["jaxpr"].jaxpr, p["jaxpr"].consts, "scan body")[0]
    outs = P.scan_p.bind(*flat[0], *flat[1], *flat[2],
                         **dict(p, jaxpr=body, num_consts=len(flat[0]),
                                num_carry=len(flat[1])))
    return _unflatten([v.aval for v in eqn.outvars], outs)


# -- the random primitives ---------------------------------------------------------------------


def _is_threefry(impl) -> bool:
    return impl.name == "threefry2x32"


def _bits(eqn, keys):
    bit_width, shape = eqn.params["bit_width"], tuple(eqn.params["shape"])
    impl = keys.impl
    if not keys.shape:
        if prng_keys.is_pallas_impl(impl):
            return prng_keys.random_bits_words(keys.words, bit_width, shape)
        if _is_threefry(impl) and jc.threefry_partitionable.value and bit_width in (8, 16, 32):
            hi, lo = jc.iota_2x32_shape(shape)
            b1, b2 = jc.threefry2x32_p.bind(*keys.words, hi, lo)
            bits = b1 ^ b2
            return bits if bit_width == 32 else bits.astype(f"uint{bit_width}")
    return jc.random_bits_impl_base(impl, keys.data(), len(keys.shape),
                                    bit_width=bit_width, shape=shape)


def _fold_in(eqn, keys, msgs):
    impl = keys.impl
    msgs = lax.convert_element_type(msgs, U32)
    shape = tuple(eqn.outvars[0].aval.shape)
    if prng_keys.is_pallas_impl(impl):
        words = [jnp.broadcast_to(w, shape) for w in keys.words]
        return Words(impl, shape, prng_keys.fold_in_words(words, jnp.broadcast_to(msgs, shape)))
    if _is_threefry(impl):
        # threefry_2x32(key, threefry_seed(m)): the counter pair (0, m).
        m = jnp.broadcast_to(msgs, shape)
        w0, w1 = (jnp.broadcast_to(w, shape) for w in keys.words)
        return Words(impl, shape, list(jc.threefry2x32_p.bind(w0, w1, jnp.zeros_like(m), m)))
    data = jc.random_fold_in_impl_base(impl, keys.data(), msgs, keys.shape)
    return Words.of_data(impl, data)


def _split(eqn, keys):
    impl, shape = keys.impl, tuple(eqn.params["shape"])
    if _is_threefry(impl) and not keys.shape and jc.threefry_partitionable.value:
        hi, lo = jc.iota_2x32_shape(shape)
        return Words(impl, shape, list(jc.threefry2x32_p.bind(*keys.words, hi, lo)))
    data = jc.random_split_impl_base(impl, keys.data(), len(keys.shape), shape=shape)
    return Words.of_data(impl, data)


def _seed(eqn, seeds):
    impl = eqn.params["impl"]
    if prng_keys.is_pallas_impl(impl):
        return Words(impl, tuple(jnp.shape(seeds)), prng_keys.seed_words(seeds))
    return Words.of_data(impl, jc.random_seed_impl_base(seeds, impl=impl))


def _wrap(eqn, data):
    return Words.of_data(eqn.params["impl"], data)


def _unwrap(eqn, keys):
    return keys.data()


def _split_key(eqn, keys):  # pltpu.unwrap_pallas_seed: the words themselves
    return list(keys.words)


def _join_key(eqn, *seeds):  # pltpu.wrap_pallas_seed
    impl = eqn.params["impl"]
    shape = tuple(eqn.outvars[0].aval.shape)
    return Words(impl, shape, [jnp.broadcast_to(jnp.asarray(s, U32), shape) for s in seeds])


_RULES = {
    jc.get_p: _get,
    jc.swap_p: _swap,
    cc.run_scoped_p: _run_scoped,
    P.jit_p: _inline("jaxpr"),
    P.closed_call_p: _inline("call_jaxpr"),
    P.remat_p: _inline("jaxpr"),
    P.custom_jvp_call_p: _inline("call_jaxpr"),
    P.custom_vjp_call_p: _inline("call_jaxpr"),
    P.cond_p: _cond,
    P.while_p: _while,
    P.scan_p: _scan,
    jc.random_bits_p: _bits,
    jc.random_fold_in_p: _fold_in,
    jc.random_split_p: _split,
    jc.random_seed_p: _seed,
    jc.random_wrap_p: _wrap,
    jc.random_unwrap_p: _unwrap,
    misc.split_key_p: _split_key,
    misc.join_key_p: _join_key,
}


# -- kernels ------------------------------------------------------------------------------


def _block_mapping(bm):
    """A key operand's block mapping over its key data: the key dims whole, at 0."""
    aval = bm.array_aval
    if not _is_key(aval.dtype):
        return bm
    ks = _key_shape(aval.dtype)
    old = bm.index_map_jaxpr

    def index_map(*args):
        outs = jc.core.eval_jaxpr(old.jaxpr, old.consts, *args)
        return [*outs, *([jnp.int32(0)] * len(ks))]

    jaxpr, _, consts = jc.trace_to_jaxpr(index_map, [v.aval for v in old.jaxpr.invars],
                                         f"index_map of {bm.origin}")
    return dataclasses.replace(
        bm, array_aval=_phys_inner(aval),
        block_dims=(*bm.block_dims, *(pl.Blocked(k) for k in ks)),
        index_map_jaxpr=jc.ClosedJaxpr(jaxpr, consts))


def physicalize(jaxpr, grid_mapping):
    """``(jaxpr, grid_mapping)`` of a kernel with its typed keys replaced by their key
    data (the same objects when it has none)."""
    gm = grid_mapping
    if not has_keys(jaxpr) and not any(_is_key(bm.array_aval.dtype)
                                       for bm in gm.block_mappings):
        return jaxpr, gm
    if any(_is_key(a.dtype) for a in gm.prefetch_avals):
        raise NotImplementedError("typed PRNG keys as scalar-prefetch operands of a Mosaic "
                                  "TPU kernel (pass their key data)")
    closed, _ = _closed(getattr(jaxpr, "jaxpr", jaxpr), getattr(jaxpr, "consts", ()),
                        "kernel with PRNG keys")
    gm = dataclasses.replace(
        gm, block_mappings=tuple(_block_mapping(bm) for bm in gm.block_mappings),
        scratch_types=tuple(_memory_ref(t) for t in gm.scratch_types))
    return closed, gm


def physicalize_body(jaxpr, scratch_types):
    """A ``core_map`` body whose operands are refs, and its scratch types, over key data
    (for TPU interpret mode, whose buffers hold arrays): ``(ClosedJaxpr, scratch types)``,
    or ``None`` when it has no keys."""
    if not has_keys(jaxpr) and not any(_is_key(t.dtype) for t in scratch_types):
        return None
    if any(_aval_has_key(v.aval) and not isinstance(v.aval, jc.AbstractRef)
           for v in jaxpr.invars):
        raise NotImplementedError("typed PRNG keys as value operands of a core_map")
    closed, _ = _closed(jaxpr, (), "core_map body with PRNG keys")
    return closed, tuple(_memory_ref(t) for t in scratch_types)


def physical_aval(aval):
    """A kernel result's aval as it crosses the custom call (key data for keys)."""
    return jc.physical_aval(aval)




def physical_request(request):
    """``request`` (a ``KernelRequest``/``LoweringRequest``) over its kernel's key data:
    the jaxpr, grid mapping and result avals without typed keys (itself when it has
    none)."""
    jaxpr, gm = physicalize(request.jaxpr, request.grid_mapping)
    if jaxpr is request.jaxpr and gm is request.grid_mapping:
        return request
    return dataclasses.replace(request, jaxpr=jaxpr, grid_mapping=gm,
                               out_avals=tuple(physical_aval(a) for a in request.out_avals))


__all__ = ["KeyRef", "Words", "has_keys", "physical_aval", "physical_request", "physicalize",
           "physicalize_body"]
