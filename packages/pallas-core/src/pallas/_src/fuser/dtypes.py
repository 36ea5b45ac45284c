"""Fusible dtypes: extended dtypes that exist only inside a fusion.

A :class:`FusionDType` packs several physical arrays into one logical array (e.g. a
quantised value and its scale) so that a fusion can pass it through primitives as one
value. :func:`physicalize` rewrites a function so that only physical arrays remain:
``pack`` becomes its components, ``unpack`` returns them, Ref reads and writes and the
ops the dtype registers (``FusionDType.register_op``) run the dtype's own rules.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from pallas._src import jax_compat as jc
from pallas._src.fuser.registry import (
    register_eval_rule,
    register_pull_block_spec_rule,
    register_push_block_spec_rule,
)


class FusibleElementDType(jc.extended_dtype):
    """The scalar type of fusion dtypes."""


class FusibleTyRules:
    allow_conversion: bool = False


class FusionDType(jc.ExtendedDType):
    """Base class of fusion dtypes: how to (un)pack values and pull/push block specs."""

    _op_registry: dict[Any, Callable[..., Any]] = {}
    _rules = FusibleTyRules
    type = FusibleElementDType

    @abc.abstractmethod
    def abstract_unpack(self, x) -> Sequence[Any]:
        """The abstract values of the components of an array ``x`` of this dtype."""

    @abc.abstractmethod
    def abstract_pack(self, *xs):
        """The abstract value of an array of this dtype packed from components ``xs``."""

    @abc.abstractmethod
    def pull_block_spec_one_step(self, aval_out, *args, **kwargs):
        """Pull rule of ``pack``: the components' block transforms from the result's."""

    @abc.abstractmethod
    def unpack_push_block_spec(self, aval_in, *args, **kwargs):
        """Push rule of ``unpack``: the components' block specs from the packed one's."""

    @abc.abstractmethod
    def unpack_pull_block_spec(self, aval_in, *args, **kwargs):
        """Pull rule of ``unpack``: the packed value's block transform from the components'."""

    @classmethod
    def register_op(cls, primitive):
        """Registers ``fn(ctx, *args, **params)`` as ``primitive`` on this dtype's values."""

        def register(fn):
            cls._op_registry[primitive] = fn
            return fn

        return register

    @classmethod
    def get_op_rule(cls, primitive):
        return cls._op_registry.get(primitive)

    @property
    def name(self) -> str:
        return str(self)


def is_fusion_type(aval) -> bool:
    return isinstance(getattr(aval, "dtype", None), FusionDType)


# -- pack / unpack -----------------------------------------------------------------------

pack_dtype_p = jc.Primitive("pack_dtype")
unpack_dtype_p = jc.Primitive("unpack_dtype")
unpack_dtype_p.multiple_results = True


def pack(*xs, dtype: FusionDType):
    """Packs physical arrays ``xs`` into one array of fusion dtype ``dtype``."""
    return pack_dtype_p.bind(*xs, dtype=dtype)


def unpack(x) -> tuple:
    """The physical components of an array of a fusion dtype."""
    return tuple(unpack_dtype_p.bind(x))


@pack_dtype_p.def_abstract_eval
def _pack_abstract_eval(*xs, dtype):
    if not isinstance(dtype, FusionDType):
        raise ValueError(f"Attempted to pack non-fusion dtype: {dtype}")
    return dtype.abstract_pack(*xs)


@unpack_dtype_p.def_abstract_eval
def _unpack_abstract_eval(x):
    if not is_fusion_type(x):
        raise ValueError(f"Attempted to unpack non-fusion dtype: {x.dtype}")
    return x.dtype.abstract_unpack(x)


@register_pull_block_spec_rule(pack_dtype_p)
def _pack_pull_rule(ctx, transform, *, dtype):
    return dtype.pull_block_spec_one_step(ctx.avals_out[0], transform)


@register_eval_rule(pack_dtype_p)
def _pack_eval_rule(ctx, *args, dtype):
    return dtype.pack_eval_rule(ctx, *args)


@register_push_block_spec_rule(unpack_dtype_p)
def _unpack_push_rule(ctx, spec):
    aval = ctx.avals_in[0]
    return aval.dtype.unpack_push_block_spec(aval, spec)


@register_pull_block_spec_rule(unpack_dtype_p)
def _unpack_pull_rule(ctx, transforms):
    aval = ctx.avals_in[0]
    return aval.dtype.unpack_pull_block_spec(aval, *transforms)


@register_eval_rule(unpack_dtype_p)
def _unpack_eval_rule(ctx, *args):
    return ctx.avals_in[0].dtype.unpack_eval_rule(ctx, *args)


# -- physicalize -------------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    avals_in: Sequence[Any]
    avals_out: Sequence[Any]


def _sub_jaxprs(params):
    for p in params.values():
        for x in (p if isinstance(p, (tuple, list)) else (p,)):
            if isinstance(x, jc.ClosedJaxpr):
                yield x.jaxpr
            elif isinstance(x, jc.Jaxpr):
                yield x


def has_fusion_types(jaxpr) -> bool:
    """Whether any value in ``jaxpr`` (or a jaxpr nested in it) has a fusion dtype."""
    if any(is_fusion_type(v.aval) for v in [*jaxpr.constvars, *jaxpr.invars]):
        return True
    for eqn in jaxpr.eqns:
        if any(is_fusion_type(v.aval) for v in eqn.outvars):
            return True
        if any(has_fusion_types(j) for j in _sub_jaxprs(eqn.params)):
            return True
    return False


def _physical_rule(eqn):
    prim = eqn.primitive
    if prim is pack_dtype_p:
        return lambda ctx, *xs, dtype: tuple(xs)
    if prim is unpack_dtype_p:
        return lambda ctx, x: tuple(x)
    types = {v.aval.dtype for v in eqn.invars if is_fusion_type(v.aval)}
    if not types:
        if any(has_fusion_types(j) for j in _sub_jaxprs(eqn.params)):
            raise NotImplementedError(
                f"pallas.fuser.physicalize: `{prim.name}` has a body with fusion dtypes; "
                "only straight-line code over fusion dtypes is supported")
        return None
    if len(types) > 1:
        raise ValueError(f"Multiple fusion types for primitive {prim.name}: {types}")
    dtype = types.pop()
    if prim is jc.get_p and hasattr(dtype, "get"):
        return lambda ctx, ref, *a, **p: dtype.get(ref, *a, **p)
    if prim is jc.swap_p and hasattr(dtype, "swap"):
        return lambda ctx, ref, val, *a, **p: dtype.swap(ref, val, *a, **p)
    rule = dtype.get_op_rule(prim)
    if rule is None:
        raise ValueError(f"No implementation found for primitive {prim.name} for custom type "
                         f"{dtype}")
    return rule


def physicalize_interp(jaxpr, consts, *args):
    """Evaluates ``jaxpr`` with fusion-dtype values held as tuples of physical arrays."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return v.val if isinstance(v, jc.Literal) else env[v]

    for eqn in jaxpr.eqns:
        vals = [read(v) for v in eqn.invars]
        rule = _physical_rule(eqn)
        with jc.source_info_util.user_context(eqn.source_info.traceback), eqn.ctx.manager:
            if rule is None:
                params = eqn.primitive.get_bind_params(eqn.params)
                outs = eqn.primitive.bind(*vals, **params)
            else:
                ctx = Context([v.aval for v in eqn.invars], [v.aval for v in eqn.outvars])
                outs = rule(ctx, *vals, **eqn.params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def physicalize(f: Callable) -> Callable:
    """Runs ``f`` with its fusion dtypes replaced by their physical components."""

    def wrapper(*args, **kwargs):
        if kwargs:
            raise NotImplementedError("physicalize: keyword arguments are not supported")
        flat_args, in_tree = jax.tree.flatten(args)
        dbg = jc.api_util.debug_info("physicalize", f, args, {})
        flat_fun, out_tree = jc.flatten_fun_nokwargs(jc.lu.wrap_init(f, debug_info=dbg),
                                                    in_tree)
        jaxpr, _, consts = jc.trace_to_jaxpr_dynamic(flat_fun, [jc.typeof(a) for a in flat_args])
        if has_fusion_types(jaxpr):
            outs = physicalize_interp(jaxpr, consts, *flat_args)
        else:
            outs = jc.eval_jaxpr(jaxpr, consts, *flat_args)
        return jax.tree.unflatten(out_tree(), outs)

    return wrapper
